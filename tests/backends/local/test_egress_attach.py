"""The local sandbox finds its init's network namespace from the pid its last start, restore or seal
reply named, without asking the keeper again (issue 34), and only while that pid is provably still
its init: a live child of the sandbox's keeper. A planted pid of another process, or a dead init,
must not put the egress proxy's listener anywhere but in the sandbox (or nowhere, with the error).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import LocalBackend
from pool.backends.local.instance.link import is_running_child
from pool.backends.local.sandbox import LocalSandbox
from pool.errors import SandboxCrashedError
from pool.network.policy import NetworkPolicy, Phase
from pool.snapshots import Snapshot
from pool.templates import Template
from pool.verification import VerificationPlan, VerifyMode

PROXY_LISTENING = ":0C38 00000000:0000 0A"
"""127.0.0.1:3128 in /proc/net/tcp, state LISTEN."""


@pytest.fixture(scope="module")
def snapshot(backend: LocalBackend) -> Snapshot:
    return backend.build(Template(name="init-pid", workdir="/app", setup=["mkdir -p /app"]))


@pytest.fixture
def sandbox(backend: LocalBackend, snapshot: Snapshot) -> Iterator[LocalSandbox]:
    box = backend.create(snapshot)
    assert isinstance(box, LocalSandbox)
    yield box
    box.close()


def proxy_listens_inside(box: LocalSandbox) -> bool:
    return PROXY_LISTENING in box.exec("cat /proc/net/tcp").stdout


def init_pid(box: LocalSandbox) -> int:
    return int(box._link.ping()["pid"])


def test_the_init_is_a_running_child_of_its_keeper_and_nothing_else_is(sandbox: LocalSandbox) -> None:
    pid = init_pid(sandbox)
    assert is_running_child(pid, sandbox.keeper_pid)
    assert not is_running_child(pid, os.getpid())
    assert not is_running_child(os.getpid(), sandbox.keeper_pid)
    assert not is_running_child(2**22 + 1, sandbox.keeper_pid)  # above any pid_max: no such process


def test_restore_and_seal_replies_name_the_init_that_runs(sandbox: LocalSandbox, tmp_path: Path) -> None:
    sandbox.restore()
    assert sandbox._init_pid == init_pid(sandbox)
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test.sh").write_text("true\n")
    sandbox.begin_verification(VerificationPlan(VerifyMode.STRICT, tests_dir=tests, outputs=("/app",)))
    assert sandbox._init_pid == init_pid(sandbox)


def test_a_planted_pid_that_is_not_the_keepers_child_is_not_used(sandbox: LocalSandbox) -> None:
    sandbox.restore()
    sandbox._init_pid = os.getpid()  # this process: its namespace is the host's
    sandbox.set_network(NetworkPolicy.offline(), phase=Phase.AGENT)
    assert proxy_listens_inside(sandbox)  # the keeper was asked: the listener is in the sandbox


def test_a_dead_init_is_not_taken_for_the_running_one(sandbox: LocalSandbox) -> None:
    sandbox.restore()
    pid = sandbox._init_pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_running_child(pid, sandbox.keeper_pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(SandboxCrashedError, match="restore"):
        sandbox.set_network(NetworkPolicy.offline(), phase=Phase.AGENT)
    sandbox.restore()
    sandbox.set_network(NetworkPolicy.offline(), phase=Phase.AGENT)
    assert proxy_listens_inside(sandbox)


def test_no_thread_of_this_process_stays_in_a_sandboxs_namespace(sandbox: LocalSandbox) -> None:
    """The listener is made by a kept helper thread that joins the sandbox's namespace: it goes back."""
    sandbox.restore()
    sandbox.set_network(NetworkPolicy.offline(), phase=Phase.AGENT)
    assert proxy_listens_inside(sandbox)
    home = os.stat("/proc/self/ns/net").st_ino
    threads = {}
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(FileNotFoundError):
            threads[task] = os.stat(f"/proc/self/task/{task}/ns/net").st_ino
    assert threads and set(threads.values()) == {home}
