"""Micro-benchmarks of the kernel operations an instance is made of, for splitting the daemon's time.

Each operation runs ``repetitions`` times in a fresh Python process started for
the purpose (so nothing of the runner's threads or mounts is in it), and its
CPU is that process's user and kernel time per operation (``getrusage`` of
itself and of the children it waited for), with the machine's kernel threads'
time over the same loop beside it: a network namespace, a mount namespace and
a cgroup are torn down partly in kworkers and RCU callbacks, after the call
that dropped them has returned. The operations (root only):

``fork``             fork, ``_exit`` and wait: the floor of any new process
``pid namespace``    a fork that unshares ``CLONE_NEWPID`` and forks the namespace's init: two forks more
``uts namespace``    ``unshare(CLONE_NEWUTS)`` (the previous one is dropped)
``ipc namespace``    ``unshare(CLONE_NEWIPC)``
``mount namespace``  ``unshare(CLONE_NEWNS)``: a copy of the caller's mounts
``network namespace`` ``unshare(CLONE_NEWNET)``: loopback, sysctls, and a teardown in a kworker
``tmpfs+overlay``    mount a tmpfs, make ``upper`` and ``work``, mount an overlay on it, unmount both
``memory cgroup``    ``mkdir`` and ``rmdir`` of a v1 memory cgroup (or a v2 one)
``pids cgroup``      the same in the pids hierarchy

Run as ``python -I benchmarks/scenarios/cost/kernelops.py REPETITIONS`` (by path, importing nothing
but the standard library: a small process forks as cheaply as the C daemon's keepers, a Python one
that imported the runner does not); prints a JSON object
``{operation: {"us_per_op": ..., "kernel_threads_us_per_op": ...}}``.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWPID, _CLONE_NEWNET = 0x20000000, 0x40000000
_MS_REC, _MS_PRIVATE, _MNT_DETACH = 0x4000, 0x40000, 2
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _unshare(flags: int) -> Callable[[], None]:
    return lambda: _check(_libc.unshare(flags), f"unshare({flags:#x})")


def _fork_and_wait() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _pid_namespace() -> None:
    """A child that unshares (a process may do it once) and forks the new namespace's init."""
    pid = os.fork()
    if pid == 0:
        code = 1
        if _libc.unshare(_CLONE_NEWPID) == 0:
            _fork_and_wait()
            code = 0
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise OSError("unshare(CLONE_NEWPID) failed in a child")


def _mount(source: str, target: str, fstype: str, flags: int, data: str) -> None:
    _check(_libc.mount(source.encode(), target.encode(), fstype.encode(), flags, data.encode()), f"mount {target}")


def _overlay(scratch: Path) -> Callable[[], None]:
    lower, stage = scratch / "lower", scratch / "stage"
    lower.mkdir()
    (lower / "file").write_text("x")
    stage.mkdir()

    def op() -> None:
        _mount("tmpfs", str(stage), "tmpfs", 0, "size=1m")
        (stage / "upper").mkdir()
        (stage / "work").mkdir()
        (stage / "root").mkdir()
        options = f"lowerdir={lower},upperdir={stage}/upper,workdir={stage}/work"
        _mount("overlay", f"{stage}/root", "overlay", 0, options)
        _check(_libc.umount2(f"{stage}/root".encode(), _MNT_DETACH), "umount overlay")
        _check(_libc.umount2(str(stage).encode(), _MNT_DETACH), "umount tmpfs")

    return op


def _cgroup(controller: str) -> Callable[[], None] | None:
    root = Path("/sys/fs/cgroup")
    base = root if (root / "cgroup.controllers").exists() else root / controller
    if not (base / "cgroup.procs").exists():
        return None
    path = base / f"snapgym-cost-{os.getpid()}"

    def op() -> None:
        path.mkdir()
        path.rmdir()

    return op


def _measure(op: Callable[[], None], repetitions: int) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    kernel_before = kernel_threads_s()
    for _ in range(repetitions):
        op()
    kernel_s = kernel_threads_s() - kernel_before
    after = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    used = sum(a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime for a, b in zip(after, before, strict=True))
    return {
        "us_per_op": 1e6 * used / repetitions,
        "kernel_threads_us_per_op": 1e6 * kernel_s / repetitions,
    }


def kernel_threads_s() -> float:
    """User and kernel seconds of the machine's kernel threads (kthreadd's children) so far."""
    total = 0
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if name == "2" or fields[1] == b"2":
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def measure_all(repetitions: int) -> dict[str, dict[str, float]]:
    """Each operation's CPU per repetition (see the module docstring); run in a process of its own."""
    _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")  # our mounts stay ours
    _mount("none", "/", "", _MS_REC | _MS_PRIVATE, "")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="snapgym-cost-") as scratch:
        ops: dict[str, Callable[[], None] | None] = {
            "fork": _fork_and_wait,
            "pid namespace": _pid_namespace,
            "uts namespace": _unshare(_CLONE_NEWUTS),
            "ipc namespace": _unshare(_CLONE_NEWIPC),
            "mount namespace": _unshare(_CLONE_NEWNS),
            "network namespace": _unshare(_CLONE_NEWNET),
            "tmpfs+overlay": _overlay(Path(scratch)),
            "memory cgroup": _cgroup("memory"),
            "pids cgroup": _cgroup("pids"),
        }
        for name, op in ops.items():
            if op is not None:
                op()  # once untimed: first-use allocations
                results[name] = _measure(op, repetitions)
    return results


if __name__ == "__main__":
    print(json.dumps(measure_all(int(sys.argv[1]))))
