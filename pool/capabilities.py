"""What a backend truthfully does, declared as data.

The pool and the environments read this; they never probe a backend with
``hasattr``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Enforcement(Enum):
    """How a resource limit is enforced, if at all."""

    CGROUP = "cgroup"
    RLIMIT = "rlimit"
    TMPFS = "tmpfs"
    NONE = "none"

    @property
    def is_enforced(self) -> bool:
        """True when something actually stops a sandbox past the limit."""
        return self is not Enforcement.NONE


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The features of one backend instance on this machine."""

    in_place_restore: bool
    """restore() resets a live sandbox without creating a new one."""
    memory_snapshot: bool
    """Snapshots capture running processes (False: files only)."""
    fork: bool
    """fork() can start many sandboxes from one snapshot cheaply."""
    gpu: bool
    """Sandboxes can use a GPU."""
    egress_control: str
    """What outbound network a sandbox gets: "loopback-only", "allowlist" or "open"."""
    limits: dict[str, Enforcement] = field(default_factory=dict)
    """Per resource ("memory", "cpu", "pids", "disk"): how it is enforced."""
    isolation: tuple[str, ...] = ()
    """The isolation mechanisms in place, e.g. ("user", "mount", "pid", ...)."""
    rootless: bool = False
    """True when the backend runs without host root privileges."""
    verification: tuple[str, ...] = ()
    """The verification modes ``sandbox.begin_verification`` supports ("strict", "shared"; see pool.verification)."""
    verifier_isolation: str = "none"
    """What keeps a shared verifier's processes from the agent's: "signals+ptrace" (neither works
    across), "ptrace" (tracing and memory access do not, signals do), or "none"."""
