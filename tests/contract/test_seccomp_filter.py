"""The seccomp filter a sandbox's processes run under, read back from the kernel and checked call by call.

The local backend builds its filter as a search over system call numbers
(``sandboxd/instance/seccomp.c``); a wrong jump there would let a call through
that a probe of a handful of calls would not notice. So the test takes the
filter the kernel holds for a process in the sandbox (``ptrace``'s
``PTRACE_SECCOMP_GET_FILTER``, as root on the host) and evaluates it, as the
kernel does, for every system call number, the x32 ABI, another architecture,
and ``clone`` with each namespace flag.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import subprocess
import time
from collections.abc import Iterator

import pytest

from pool import LocalBackend, LocalSandbox, Snapshot

if platform.machine() != "x86_64" or os.geteuid() != 0:
    pytest.skip("reads the filter of an x86_64 sandbox with ptrace, as root", allow_module_level=True)

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
EPERM, ENOSYS = 1, 38

DENIED_EPERM = {
    "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428,
    "mount_setattr": 442, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321,
    "perf_event_open": 298, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "kexec_load": 246, "kexec_file_load": 320, "open_by_handle_at": 304, "name_to_handle_at": 303,
    "userfaultfd": 323, "swapon": 167, "swapoff": 168, "reboot": 169, "acct": 163, "quotactl": 179,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
}  # fmt: skip
"""x86_64 numbers of the calls refused with EPERM (Docker's default profile refuses the same)."""
CLONE, CLONE3 = 56, 435
NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}  # fmt: skip
THREAD_FLAGS = 0x003D0F00  # what glibc's pthread_create passes: no namespace among them

_PTRACE_ATTACH, _PTRACE_DETACH, _PTRACE_SECCOMP_GET_FILTER = 16, 17, 0x420C


@pytest.fixture()
def sandbox(backend: LocalBackend, snap: Snapshot) -> Iterator[LocalSandbox]:
    with backend.create(snap) as sbx:
        yield sbx


def installed_filter(pid: int) -> list[tuple[int, int, int, int]]:
    """The classic BPF of the first filter ``pid`` runs under: ``(code, jt, jf, k)`` per instruction."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    if libc.ptrace(_PTRACE_ATTACH, pid, None, None) != 0:
        raise OSError(ctypes.get_errno(), f"PTRACE_ATTACH {pid}")
    try:
        os.waitpid(pid, 0x40000000)  # __WALL: the process is not our child
        count = libc.ptrace(_PTRACE_SECCOMP_GET_FILTER, pid, 0, None)
        if count <= 0:
            raise OSError(ctypes.get_errno(), f"PTRACE_SECCOMP_GET_FILTER {pid}")
        buffer = ctypes.create_string_buffer(8 * count)
        if libc.ptrace(_PTRACE_SECCOMP_GET_FILTER, pid, 0, buffer) != count:
            raise OSError(ctypes.get_errno(), f"PTRACE_SECCOMP_GET_FILTER {pid}")
    finally:
        libc.ptrace(_PTRACE_DETACH, pid, None, None)
    return [struct.unpack_from("<HBBI", buffer.raw, 8 * i) for i in range(count)]


def run_filter(program: list[tuple[int, int, int, int]], nr: int, arch: int, arg0: int = 0) -> int:
    """What the filter returns for a call, evaluated as the kernel's classic BPF does (loads of
    ``seccomp_data`` words, jumps against constants, returns of constants: all a seccomp filter may use)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    accumulator, pc = 0, 0
    for _ in range(len(program) + 1):  # classic BPF only jumps forward
        code, jt, jf, k = program[pc]
        kind = code & 0x07
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            accumulator = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        elif kind == 0x05:  # BPF_JMP
            op = code & 0xF0
            if op == 0x00:  # BPF_JA
                pc += k
            else:
                taken = {0x10: accumulator == k, 0x20: accumulator > k, 0x30: accumulator >= k,
                         0x40: bool(accumulator & k)}[op]  # fmt: skip
                pc += jt if taken else jf
        else:
            raise AssertionError(f"instruction {pc} has code {code:#x}, which this reader does not know")
        pc += 1
    raise AssertionError("the filter ran past its end")


def test_every_system_call_gets_the_documented_verdict(sandbox: LocalSandbox) -> None:
    """Each number up to 600 (past the last x86_64 call) for x86_64, the x32 ABI, i386, and clone's flags."""
    marker = f"sleep {4700 + os.getpid() % 1000}"
    sandbox.exec(f"{marker} >/dev/null 2>&1 &")
    pid = _host_pid_of(marker)
    program = installed_filter(pid)

    wrong = []
    for nr in range(600):
        expected = RET_ALLOW
        if nr in DENIED_EPERM.values():
            expected = RET_ERRNO | EPERM
        elif nr == CLONE3:
            expected = RET_ERRNO | ENOSYS
        got = run_filter(program, nr, AUDIT_ARCH_X86_64)
        if got != expected:
            wrong.append((nr, hex(got), hex(expected)))
    assert not wrong, f"calls whose verdict is not the documented one (number, got, expected): {wrong}"
    assert run_filter(program, CLONE, AUDIT_ARCH_X86_64, THREAD_FLAGS) == RET_ALLOW
    for name, flag in NAMESPACE_FLAGS.items():
        assert run_filter(program, CLONE, AUDIT_ARCH_X86_64, flag | 17) == RET_ERRNO | EPERM, name
    assert run_filter(program, 0x40000000 + 165, AUDIT_ARCH_X86_64) == RET_ERRNO | EPERM  # x32's mount
    assert run_filter(program, 0x40000000 + 39, AUDIT_ARCH_X86_64) == RET_ERRNO | EPERM  # x32's getpid
    assert run_filter(program, 20, AUDIT_ARCH_I386) == RET_KILL_PROCESS  # i386's getpid


def test_the_reader_fails_a_filter_that_lets_a_denied_call_through() -> None:
    """The evaluation above can fail: a chain that forgets ``mount`` answers ALLOW for it."""
    program = [
        (0x20, 0, 0, 4), (0x15, 1, 0, AUDIT_ARCH_X86_64), (0x06, 0, 0, RET_KILL_PROCESS),
        (0x20, 0, 0, 0), (0x15, 0, 1, DENIED_EPERM["unshare"]), (0x06, 0, 0, RET_ERRNO | EPERM),
        (0x06, 0, 0, RET_ALLOW),
    ]  # fmt: skip
    assert run_filter(program, DENIED_EPERM["unshare"], AUDIT_ARCH_X86_64) == RET_ERRNO | EPERM
    assert run_filter(program, DENIED_EPERM["mount"], AUDIT_ARCH_X86_64) == RET_ALLOW


def _host_pid_of(command: str) -> int:
    """The host's pid of the one process whose command line is ``command`` (started in a sandbox)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-x", "-f", command], capture_output=True, text=True, check=False)
        pids = found.stdout.split()
        if len(pids) == 1:
            return int(pids[0])
        time.sleep(0.05)
    raise AssertionError(f"no single host process runs {command!r} (pgrep said {found.stdout!r})")
