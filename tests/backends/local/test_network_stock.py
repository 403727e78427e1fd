"""Network namespaces made ahead for new sandboxes (sandboxd/netstock.c, issue 34 item 4).

The daemon keeps a stock of new network namespaces, made by a helper process (the netmaker), and
hands them to the keepers it forks. What must hold: every sandbox still gets a namespace of its
own (a stocked one handed twice would join two sandboxes' loopbacks), set up as an instance's own
(loopback up, every port bindable, no TIME_WAIT), never counted as reused, held by nothing but the
daemon until it is handed over; the stock grows to a burst's size; and sandboxes still start when
the stock is off or its helper has died.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import LocalBackend, Snapshot
from pool.backends.local.sandbox import LocalSandbox
from tests.support.backends import LIMITS, WORKSPACE_TEMPLATE
from tests.support.needs import skip_missing

CHILDREN = 24
REPO = Path(__file__).resolve().parents[3]

PROBE = (
    "readlink /proc/self/ns/net; cat /proc/sys/net/ipv4/tcp_max_tw_buckets "
    "/proc/sys/net/ipv4/ip_unprivileged_port_start; python3 -c 'import socket; s = socket.socket(); "
    's.bind(("127.0.0.1", 80)); s.listen(); socket.create_connection(("127.0.0.1", 80)); print("served")\''
)
"""Inside a sandbox: its network namespace, the two settings, and a server on port 80 reached over loopback."""


@pytest.fixture(scope="module")
def own_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    """A backend of this module's own: its daemon's stock is not shaped by other tests' sandboxes."""
    if os.geteuid() != 0:
        skip_missing("needs root (network namespaces of the local backend)")
    with LocalBackend(store_dir=tmp_path_factory.mktemp("store"), **LIMITS) as made:
        yield made


@pytest.fixture(scope="module")
def own_snap(own_backend: LocalBackend) -> Snapshot:
    return own_backend.build(WORKSPACE_TEMPLATE)


def _network_namespaces_held(pid: int) -> set[str]:
    """The network namespaces a process holds descriptors on (``net:[inode]``)."""
    held = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("net:"):
            held.add(target)
    return held


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _netmaker(daemon: int) -> int | None:
    for child in _children(daemon):
        if Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"snapgym-netstock"):
            return child
    return None


def _stock_reaches(daemon: int, count: int, timeout_s: float = 10.0) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while len(held := _network_namespaces_held(daemon)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return held


def _probe(sandbox: LocalSandbox) -> list[str]:
    result = sandbox.exec(PROBE)
    assert result.exit_code == 0, result.stderr
    return result.stdout.split()


def test_each_fork_child_gets_a_stocked_namespace_of_its_own(own_backend: LocalBackend, own_snap: Snapshot) -> None:
    daemon = own_backend.runtime.daemon().pid
    stocked = _stock_reaches(daemon, 8)
    assert len(stocked) >= 8, "the daemon made no network namespaces ahead"
    children = own_backend.fork(own_snap, CHILDREN)
    try:
        seen = [_probe(child) for child in children]
        namespaces = [probe[0] for probe in seen]
        assert len(set(namespaces)) == CHILDREN, "two sandboxes share a network namespace"
        assert os.readlink("/proc/self/ns/net") not in namespaces
        assert len(stocked & set(namespaces)) >= 8, "the children made their own instead of taking the stock"
        for probe in seen:  # as an instance sets up its own: loopback up, no TIME_WAIT, port 80 bindable
            assert probe[1:] == ["0", "0", "served"], probe
        assert all(child.reused == {"cgroup": False, "netns": False} for child in children)
        held = _network_namespaces_held(daemon)
        assert not held & set(namespaces), "the daemon still holds a namespace it handed over"
    finally:
        for child in children:
            child.close()


def test_the_stock_grows_to_a_burst_and_only_the_daemon_holds_it(own_backend: LocalBackend, own_snap: Snapshot) -> None:
    daemon = own_backend.runtime.daemon().pid
    for child in own_backend.fork(own_snap, CHILDREN):
        child.close()
    held = _stock_reaches(daemon, CHILDREN)
    assert len(held) >= CHILDREN, f"the stock stayed at {len(held)} after a burst of {CHILDREN}"
    maker = _netmaker(daemon)
    assert maker is not None, "no netmaker process under the daemon"
    assert not _network_namespaces_held(maker), "the netmaker keeps a namespace it made"
    # Nothing else holds the stock: not a keeper (which would hand it to an instance early), not a sandbox.
    for keeper in _children(daemon):
        if keeper != maker:
            assert not held & _network_namespaces_held(keeper)


def test_sandboxes_start_when_the_netmaker_dies(own_backend: LocalBackend, own_snap: Snapshot) -> None:
    daemon = own_backend.runtime.daemon().pid
    maker = _netmaker(daemon)
    if maker is not None:
        os.kill(maker, signal.SIGKILL)
    children = own_backend.fork(own_snap, CHILDREN * 3)  # more than the stock holds: the rest make their own
    try:
        namespaces = [_probe(child)[0] for child in children]
        assert len(set(namespaces)) == len(children)
    finally:
        for child in children:
            child.close()
    assert _netmaker(daemon) is None


def test_no_stock_without_prewarm(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        skip_missing("needs root (network namespaces of the local backend)")
    with LocalBackend(store_dir=tmp_path / "store", prewarm=False, **LIMITS) as backend:
        snap = backend.build(WORKSPACE_TEMPLATE)
        sandbox = backend.create(snap)
        daemon = backend.runtime.daemon().pid
        assert _netmaker(daemon) is None
        assert not _network_namespaces_held(daemon)
        assert _probe(sandbox)[1:] == ["0", "0", "served"]


def test_the_stock_stays_within_an_eighth_of_the_open_file_limit(tmp_path: Path) -> None:
    """Each stocked namespace is a descriptor of the daemon's: a low limit must not leave none for sandboxes."""
    if os.geteuid() != 0:
        skip_missing("needs root (network namespaces of the local backend)")
    script = f"""
import resource, time
from pool import LocalBackend
from tests.support.backends import LIMITS, WORKSPACE_TEMPLATE
from tests.backends.local.test_network_stock import _network_namespaces_held
resource.setrlimit(resource.RLIMIT_NOFILE, (160, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
with LocalBackend(store_dir={str(tmp_path / "store")!r}, **LIMITS) as backend:
    snap = backend.build(WORKSPACE_TEMPLATE)
    for child in backend.fork(snap, 40):
        child.close()
    time.sleep(1.0)
    print(len(_network_namespaces_held(backend.runtime.daemon().pid)))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) == 160 // 8
