"""Kernel feature checks, what they let the backend declare, and errors that name the missing feature and the way out.

The local backend's :class:`~pool.capabilities.Capabilities` follow from the kernel and from running
as root: memory, processes and CPU are cgroup limits where the backend has the controllers
(otherwise rlimits for memory and processes, and CPU unlimited); the egress proxy reaches into
sandboxes only as root (rootless: loopback only); a shared verifier is kept from the agent's signals
only from Landlock ABI 6 (Linux 6.12), from its tracing from ABI 1.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pool.capabilities import Capabilities, ChangesSource, Enforcement, Location, VerifierIsolation
from pool.egress.onhost.service import EgressService
from pool.errors import UnsupportedError
from pool.templates import HOST_BASE

_ALTERNATIVES = "Alternatives: run as root, or use another backend (docker, e2b, daytona, modal)."


def require_linux() -> None:
    """Fail clearly on anything but Linux with overlayfs."""
    if not sys.platform.startswith("linux"):
        raise UnsupportedError(
            f"the local backend needs Linux namespaces and overlayfs; this is {sys.platform}: "
            "run it on a Linux machine or VM"
        )
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if "overlay" not in filesystems:
        raise UnsupportedError(
            "the kernel has no overlayfs (not in /proc/filesystems); load it with 'modprobe overlay'. " + _ALTERNATIVES
        )


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def explain_daemon_failure(message: str, *, rootless: bool) -> UnsupportedError:
    """Turn a failed daemon start into an error naming the kernel setting."""
    hints = []
    if rootless:
        if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
            hints.append("unprivileged user namespaces are off: sysctl -w kernel.unprivileged_userns_clone=1")
        if _read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == "1":
            hints.append(
                "AppArmor restricts unprivileged user namespaces: "
                "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0"
            )
        if _read("/proc/sys/user/max_user_namespaces") == "0":
            hints.append("user.max_user_namespaces is 0: sysctl -w user.max_user_namespaces=15000")
    hint = "; ".join(hints) or "the kernel refused to create the sandbox namespaces"
    return UnsupportedError(f"cannot start the local sandbox daemon: {message} ({hint}). {_ALTERNATIVES}")


_LANDLOCK_CREATE_RULESET = {"x86_64": 444, "aarch64": 444}


def landlock_abi() -> int:
    """The Landlock ABI this kernel offers (0: none); the sandbox daemon confines each init with it."""
    number = _LANDLOCK_CREATE_RULESET.get(platform.machine())
    if number is None:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    abi = int(libc.syscall(number, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))
    return max(abi, 0)


def capabilities(
    controllers: frozenset[str], egress: Mapping[str, Any], *, rootless: bool, landlock_abi: int
) -> Capabilities:
    """The local backend's capabilities with the cgroup ``controllers`` it may use, its egress service's
    ``capability_fields``, and the kernel's Landlock ABI (see the module docstring)."""
    return Capabilities(
        in_place_restore=True,
        memory_snapshot=False,
        fork=True,
        gpu=False,
        **egress,
        limits={
            "memory": Enforcement.CGROUP if "memory" in controllers else Enforcement.RLIMIT,
            "pids": Enforcement.CGROUP if "pids" in controllers else Enforcement.RLIMIT,
            "cpu": Enforcement.CGROUP if "cpu" in controllers else Enforcement.NONE,
            "disk": Enforcement.TMPFS,
        },
        isolation=("user", "mount", "pid", "network", "ipc", "uts"),
        rootless=rootless,
        verification=("strict", "toolchain", "shared"),
        verifier_isolation=_verifier_isolation(landlock_abi),
        sandbox_location=Location.NODE,
        snapshot_location=Location.NODE,
        bases=(HOST_BASE, "rootfs", "image", "dockerfile"),
        changes=ChangesSource.HOST,
        shell_session=True,
    )


def capability_range() -> dict[str, Capabilities]:
    """The capabilities as root on a kernel that gives the backend everything, then under each
    condition that takes something away (``LocalBackend.capability_range``)."""
    every = frozenset(("memory", "pids", "cpu"))
    typical: dict[str, Any] = {
        "controllers": every,
        "egress": EgressService(None).capability_fields,
        "rootless": False,
        "landlock_abi": 6,
    }

    def under(**changes: Any) -> Capabilities:
        return capabilities(**{**typical, **changes})

    loopback = EgressService(None, available=False).capability_fields
    return {
        "root, with the memory, pids and cpu cgroup controllers, Landlock ABI 6+ (Linux 6.12)": under(),
        "no cgroup controllers for the backend": under(controllers=frozenset()),
        "rootless (snapgym not root)": under(controllers=frozenset(), egress=loopback, rootless=True),
        "Landlock ABI 1-5 (Linux 5.13-6.11)": under(landlock_abi=1),
        "no Landlock": under(landlock_abi=0),
    }


def _verifier_isolation(landlock_abi: int) -> VerifierIsolation:
    if landlock_abi >= 6:
        return VerifierIsolation.SIGNALS_PTRACE
    return VerifierIsolation.PTRACE if landlock_abi >= 1 else VerifierIsolation.NONE
