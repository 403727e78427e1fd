"""Kernel feature checks, and errors that name the missing feature and the way out."""

from __future__ import annotations

import ctypes
import platform
import sys
from pathlib import Path

from pool.errors import UnsupportedError

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
