"""test.sh started with no shell in front (``LocalSandbox.run_script``) is what ``sh -c`` would have run.

The verifier used to run ``cd -- WORKDIR || cd /; exec /bin/bash /tests/test.sh`` through ``/bin/sh -c``:
two program starts. The sandbox's init now starts ``/bin/bash`` (``/bin/sh`` where bash cannot be
run) itself, in the workdir (``/`` where it cannot be entered), with the same arguments,
environment, timeout and output cap.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import LocalBackend, LocalSandbox, Snapshot, Template
from pool.contract import RunsScripts
from tests.backends.local.test_rootfs_base import _libraries

APP = Template(name="tests-run-script", setup=["mkdir -p /app /tests"], workdir="/app")
PROBE = 'echo "$0|$PWD|${BASH_VERSION:+bash}|$SECRET|$#|${OLDPWD-none}"; echo err >&2; exit 3\n'


@pytest.fixture(scope="module")
def app(backend: LocalBackend) -> Snapshot:
    return backend.build(APP)


@pytest.fixture()
def sandbox(backend: LocalBackend, app: Snapshot) -> Iterator[LocalSandbox]:
    with backend.create(app) as sbx:
        sbx.write_file("/tests/test.sh", PROBE, mode=0o644)
        yield sbx


def test_bash_runs_the_script_in_the_workdir_as_sh_would_start_it(sandbox: LocalSandbox) -> None:
    assert isinstance(sandbox, RunsScripts)
    got = sandbox.run_script("/tests/test.sh", cwd="/app", env={"SECRET": "s"})
    old = sandbox.exec("cd -- /app 2>/dev/null || cd /\nexec /bin/bash /tests/test.sh", cwd="/", env={"SECRET": "s"})
    assert (got.stderr, got.exit_code) == (old.stderr, old.exit_code) == ("err\n", 3)
    # the same but the OLDPWD that the shell's cd exported
    assert (got.stdout, old.stdout) == ("/tests/test.sh|/app|bash|s|0|none\n", "/tests/test.sh|/app|bash|s|0|/\n")


def test_a_workdir_that_is_gone_runs_the_script_from_the_root(sandbox: LocalSandbox) -> None:
    sandbox.exec("rm -rf /app", cwd="/")
    assert sandbox.run_script("/tests/test.sh", cwd="/app").stdout.split("|")[1] == "/"


def rootfs(backend: LocalBackend, dest: Path, tools: tuple[str, ...]) -> Snapshot:
    """A base of a few host programs (and the libraries they load) with a /tests/test.sh."""
    for tool in tools:
        real = os.path.realpath(shutil.which(tool) or tool)
        for path in [real, *_libraries(real)]:
            target = dest / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        (dest / "bin").mkdir(exist_ok=True)
        (dest / "bin" / tool).symlink_to(real)
    (dest / "etc").mkdir()
    (dest / "etc" / "os-release").write_text("ID=snapgym-test\n")
    (dest / "tests").mkdir()
    (dest / "tests" / "test.sh").write_text(PROBE)
    (dest / "app").mkdir()
    return backend.build(Template(name=f"tests-run-script-{'-'.join(tools)}", base=str(dest), workdir="/app"))


def test_no_shell_is_started_in_front(backend: LocalBackend, tmp_path: Path) -> None:
    """Without /bin/sh, ``sh -c`` cannot start at all; the script still runs, and no ``cd`` of a shell
    left its OLDPWD."""
    with backend.create(rootfs(backend, tmp_path, ("bash", "sh", "rm", "mkdir"))) as box:
        assert box.exec("rm /bin/sh").exit_code == 0 and box.exec("true").exit_code == 127
        assert box.run_script("/tests/test.sh", cwd="/app").stdout == "/tests/test.sh|/app|bash||0|none\n"
        assert box.run_script("/tests/env.sh", cwd="/app").exit_code == 127  # no such script: bash says so


def test_without_bash_sh_runs_it(backend: LocalBackend, tmp_path: Path) -> None:
    with backend.create(rootfs(backend, tmp_path, ("sh", "mkdir"))) as box:
        assert box.run_script("/tests/test.sh", cwd="/app").stdout == "/tests/test.sh|/app|||0|none\n"


def test_the_timeout_and_the_cap_hold(sandbox: LocalSandbox) -> None:
    sandbox.write_file("/tests/slow.sh", "head -c 100000 /dev/zero | tr '\\0' x\nsleep 30\n")
    got = sandbox.run_script("/tests/slow.sh", cwd="/app", timeout_s=1, max_output_bytes=1000)
    assert got.timed_out and len(got.stdout) <= 1000
