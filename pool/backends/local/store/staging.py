"""Names for temporary entries in the store that say whether their owner is still alive.

A layer is assembled in a staging folder and a record in a temporary file, both
next to their final place so that the last step is one atomic rename. A process
killed before that step (SIGKILL, power loss) leaves them behind; their names
carry the owner (machine, boot, PID namespace, PID and the process's start time),
so the next backend on the store removes exactly those whose owner is dead:
same machine and an older boot, or the same PID namespace and no process with
that PID and start time. Entries of other machines (a store on a network
filesystem) or other PID namespaces are left alone, since their owners cannot be
seen from here.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import secrets
import socket
import time
from pathlib import Path

PREFIX = ".staging-"
# Store format 1 named staging folders ".tmp-*" and record files "<id>.tmp<pid>",
# which do not say who owns them: those an hour old are taken for dead.
_LEGACY = re.compile(r"^\.tmp-.*|.*\.tmp\d+$")
_LEGACY_AGE_S = 3600.0


def new_name(purpose: str = "") -> str:
    """A fresh staging name owned by this process."""
    return f"{PREFIX}{_owner()}-{secrets.token_hex(4)}{purpose}"


def is_orphan(path: Path) -> bool:
    """True when ``path`` is a staging entry whose owner is certainly dead."""
    name = path.name
    if _LEGACY.match(name):
        return _older_than(path, _LEGACY_AGE_S)
    if not name.startswith(PREFIX):
        return False
    parts = name[len(PREFIX) :].split("-")
    if len(parts) < 6:
        return False
    machine, boot, pidns, pid, start = parts[:5]
    here_machine, here_boot, here_ns = _place()
    if machine != here_machine:
        return False
    if boot != here_boot:
        return True  # this machine rebooted since: every process of that boot is gone
    if pidns != here_ns or not pid.isdigit():
        return False
    return _start_time(int(pid)) != start


def _owner() -> str:
    return _owner_of(os.getpid())  # looked up again in a forked child


@functools.cache
def _owner_of(pid: int) -> str:
    machine, boot, pidns = _place()
    return f"{machine}-{boot}-{pidns}-{pid}-{_start_time(pid)}"


@functools.cache
def _place() -> tuple[str, str, str]:
    try:
        machine = Path("/etc/machine-id").read_text().strip()
    except OSError:
        machine = ""
    machine = hashlib.sha256((machine or socket.gethostname()).encode()).hexdigest()[:8]
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
    except OSError:
        boot = "noboot"
    return machine, boot, str(os.stat("/proc/self/ns/pid").st_ino)


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ("gone" when there is none)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    # Field 22; the command name (field 2) may hold spaces and parentheses.
    return text[text.rindex(")") + 2 :].split()[19]


def _older_than(path: Path, age_s: float) -> bool:
    try:
        return time.time() - path.lstat().st_mtime > age_s
    except FileNotFoundError:
        return False
