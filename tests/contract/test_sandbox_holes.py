"""Smaller holes found by trying the sandbox as a hostile agent would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import CommandRejectedError, LocalBackend, LocalSandbox, Snapshot
from pool.backends.local.store.catalogue import default_runtime_dir
from pool.verification import VerificationPlan, VerifyMode

IO_URING_SETUP = 425  # x86_64 and aarch64


@pytest.fixture()
def sandbox(backend: LocalBackend, snap: Snapshot) -> Iterator[LocalSandbox]:
    with backend.create(snap) as sbx:
        yield sbx


def test_io_uring_is_refused(sandbox: LocalSandbox) -> None:
    """io_uring requests pass no seccomp filter, so, as in Docker's default profile, it is not there."""
    probe = (
        "import ctypes, errno; libc = ctypes.CDLL(None, use_errno=True); params = ctypes.create_string_buffer(120)\n"
        f"rc = libc.syscall({IO_URING_SETUP}, 8, params); print(rc, errno.errorcode[ctypes.get_errno()])\n"
    )
    sandbox.write_file("/tmp/uring.py", probe)
    assert sandbox.exec("python3 /tmp/uring.py").stdout == "-1 EPERM\n"


def host_paths(backend: LocalBackend) -> list[str]:
    return [str(backend.store.root), str(default_runtime_dir()), str(Path(backend.store.root).resolve())]


def test_mountinfo_shows_no_store_or_runtime_paths(
    backend: LocalBackend, sandbox: LocalSandbox, tmp_path: Path
) -> None:
    """The overlay options name layers through links in the sandbox's stage, not by their host paths."""
    (tmp_path / "test.sh").write_text("true\n")
    views = [sandbox.exec("cat /proc/self/mountinfo").stdout]
    sandbox.begin_verification(VerificationPlan(VerifyMode.STRICT, tmp_path, outputs=("/workspace",)))
    views.append(sandbox.exec("cat /proc/self/mountinfo").stdout)
    sandbox.restore()
    sandbox.begin_verification(VerificationPlan(VerifyMode.SHARED, tmp_path))
    views.append(sandbox.exec("cat /proc/self/mountinfo").stdout)
    for view in views:
        assert "overlay" in view
        for path in host_paths(backend):
            assert path not in view, f"{path} shows in the sandbox's mountinfo:\n{view}"


def test_an_environment_over_the_kernels_limit_is_a_clear_error(sandbox: LocalSandbox) -> None:
    with pytest.raises(CommandRejectedError, match=r"BIG is \d+ bytes; the kernel takes at most"):
        sandbox.exec("true", env={"BIG": "x" * (200 * 1024)})
    many = {f"V{i}": "y" * 100_000 for i in range(12)}
    with pytest.raises(CommandRejectedError, match="together; the limit is"):
        sandbox.exec("true", env=many)
    assert sandbox.exec("echo ${#V}", env={"V": "z" * 100_000}).stdout == "100000\n"  # a large one that fits


def test_the_agent_cannot_make_itself_immune_to_the_oom_killer(sandbox: LocalSandbox) -> None:
    """init is as safe as the host allows (immune where the daemon holds CAP_SYS_RESOURCE); the agent's are not."""
    r = sandbox.exec("cat /proc/self/oom_score_adj; echo -1000 > /proc/self/oom_score_adj 2>/dev/null || echo refused")
    assert r.stdout == "0\nrefused\n"
    assert int(sandbox.exec("cat /proc/1/oom_score_adj").stdout) in (-1000, 0)


def test_the_device_nodes_work_and_the_agent_cannot_make_or_change_them(sandbox: LocalSandbox) -> None:
    """/dev holds the usual character devices, usable by the agent; it may not make one (no CAP_MKNOD) nor change,
    remove or replace theirs (the host's nodes, bound in: mount points), so /dev/null stays /dev/null for the
    rest of the episode (a shared verifier runs beside the agent's leftovers). Nodes made with mknod in /dev's
    tmpfs, which the sandbox's root owns, would cost less to set up but could be removed and replaced."""
    r = sandbox.exec(
        "for d in null zero full random urandom tty; do stat -c '%n %F %t:%T %a' /dev/$d; done;"
        " echo gone > /dev/null && head -c 3 /dev/zero | od -An -tx1 | tr -d ' ' && head -c 5 /dev/urandom | wc -c"
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines() == [
        "/dev/null character special file 1:3 666",
        "/dev/zero character special file 1:5 666",
        "/dev/full character special file 1:7 666",
        "/dev/random character special file 1:8 666",
        "/dev/urandom character special file 1:9 666",
        "/dev/tty character special file 5:0 666",
        "000000",
        "5",
    ]
    for attempt in ("mknod /tmp/disk b 8 0", "chmod 600 /dev/null", "chown 0 /dev/null", "rm /dev/null"):
        refused = sandbox.exec(f"{attempt} && echo done")
        assert refused.exit_code != 0 and "done" not in refused.stdout, f"{attempt}: {refused}"
    assert sandbox.exec("stat -c '%F %a' /dev/null").stdout == "character special file 666\n"
