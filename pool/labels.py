"""Labels on sandboxes: who made each one, so nothing outlives its run unnoticed.

Every backend puts :data:`OWNER` on each sandbox it makes (the making
process, on this machine), and keeps the labels a caller gives: the runner
gives :data:`RUN` and :data:`ATTEMPT`, a pool :data:`POOL`. A backend's
``reap_orphans()`` removes sandboxes whose owner process is gone; on a remote
provider the labels are also how a person finds what a run left behind.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections.abc import Mapping
from pathlib import Path

from pool.errors import ConfigError

OWNER = "snapgym.owner"
"""``<host>/<boot id>/<pid>/<token>`` of the backend instance that made the sandbox."""
RUN = "snapgym.run"
"""The run (the runner's output folder name) the sandbox serves."""
POOL = "snapgym.pool"
"""The pool that holds the sandbox."""
HOST = "snapgym.host"
"""The pool's host actor that holds the sandbox (on a cloud backend, how a dead host's sandboxes are found)."""
ATTEMPT = "snapgym.attempt"
"""The episode attempt (``<task>/<episode>/<attempt>``) the sandbox was made for."""

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")
_MAX_VALUE_CHARS = 256
_MAX_LABELS = 32


def check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """Labels as a plain dict of strings, refused when a provider could not store them.

    Raises:
        ConfigError: a key that is not ``[A-Za-z0-9._/-]`` (up to 63 characters), a value
            over 256 characters or with a control character, or more than 32 labels.
    """
    found = {str(k): str(v) for k, v in dict(labels or {}).items()}
    if len(found) > _MAX_LABELS:
        raise ConfigError(f"at most {_MAX_LABELS} labels per sandbox, got {len(found)}")
    for key, value in found.items():
        if not _KEY.match(key):
            raise ConfigError(f"label key {key!r} must be letters, digits, '.', '_', '/', '-' (up to 63)")
        if len(value) > _MAX_VALUE_CHARS or any(ord(c) < 32 for c in value):
            raise ConfigError(f"label {key!r}: values are up to {_MAX_VALUE_CHARS} printable characters")
    return found


def new_owner() -> str:
    """A fresh owner value for a backend instance of this process."""
    return f"{socket.gethostname()}/{boot_id()}/{os.getpid()}/{secrets.token_hex(4)}"


_CLOSED_OWNERS: set[str] = set()
"""Owners of this process whose backend instance has closed."""


def owner_closed(owner: str) -> None:
    """A backend instance of this process closed: what it left (kept checkpoints) counts as a gone owner's."""
    _CLOSED_OWNERS.add(owner)


def owner_is_gone(owner: str) -> bool:
    """True when ``owner`` names a process of this machine's current boot that no longer runs, or a
    backend instance of this process that closed.

    An owner from another machine, or one that cannot be parsed, is not judged gone: it
    may be alive elsewhere. An owner from an earlier boot of this machine is gone.
    """
    if owner in _CLOSED_OWNERS:
        return True
    parts = owner.split("/")
    if len(parts) != 4 or parts[0] != socket.gethostname() or not parts[2].isdigit():
        return False
    if parts[1] != boot_id():
        return True
    try:
        os.kill(int(parts[2]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def boot_id() -> str:
    """This boot of the kernel (changes at every reboot)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown-boot"
