"""What a backend truthfully does, declared as data.

The pool and the environments read this; they never probe a backend with
``hasattr``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, StrEnum


class Enforcement(Enum):
    """How a resource limit is enforced, if at all."""

    CGROUP = "cgroup"
    RLIMIT = "rlimit"
    TMPFS = "tmpfs"
    QUOTA = "quota"
    """A filesystem quota (the Docker engine's ``storage_opt`` on xfs with pquota, btrfs, zfs)."""
    PROVIDER = "provider"
    """The cloud provider sizes the sandbox (its VM or container) as asked; snapgym cannot check it."""
    NONE = "none"

    @property
    def is_enforced(self) -> bool:
        """True when something actually stops a sandbox past the limit."""
        return self is not Enforcement.NONE


class EgressControl(StrEnum):
    """How a sandbox's outbound network is controlled."""

    PROXY = "proxy"
    """Only through snapgym's egress proxy on the host, which enforces the phase's policy (pool.egress)."""
    PROVIDER = "provider"
    """The provider's own controls."""
    LOOPBACK_ONLY = "loopback-only"
    """No way out at all."""


class VerifierIsolation(StrEnum):
    """What keeps a shared verifier's processes from the agent's."""

    SIGNALS_PTRACE = "signals+ptrace"
    """Neither signals nor tracing work across."""
    PTRACE = "ptrace"
    """Tracing and memory access do not work across; signals do."""
    NONE = "none"


class Location(StrEnum):
    """Where a backend's sandboxes or snapshots live."""

    NODE = "node"
    """On the machine of the process that made them."""
    REMOTE = "remote"
    """In a service (a provider, a registry) every node reaches."""


class ChangesSource(StrEnum):
    """Who lists what an episode changed (``sandbox.changes()``, see pool.changes)."""

    HOST = "host"
    """The sandbox's writable layer, read on the host."""
    ENGINE = "engine"
    """The container engine."""
    NONE = "none"
    """No listing the agent could not forge: ``changes()`` raises UnsupportedError."""


_CLOSED = {
    "egress_control": EgressControl,
    "verifier_isolation": VerifierIsolation,
    "sandbox_location": Location,
    "snapshot_location": Location,
    "changes": ChangesSource,
}
"""The fields with a closed set of values, and their Enums (checked, and a plain string turned into the
Enum, when Capabilities are built)."""


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
    egress_control: EgressControl
    """How a sandbox's outbound network is controlled: "proxy" (only through snapgym's egress proxy
    on the host, which enforces the phase's policy: see pool.egress), "provider" (the provider's own
    controls) or "loopback-only" (no way out at all)."""
    network_modes: tuple[str, ...] = ("no-network",)
    """The network policies (``pool.egress.NetworkMode`` values) ``sandbox.set_network`` enforces."""
    egress_audit: bool = False
    """``sandbox.network_log()`` records every connection attempt, allowed or denied."""
    build_network_modes: tuple[str, ...] = ("no-network", "public")
    """The build policies (``Template.network``) a build enforces; ``public`` without the proxy is the
    backend's own network, unfiltered and unrecorded (see pool.build.network)."""
    limits: dict[str, Enforcement] = field(default_factory=dict)
    """Per resource ("memory", "cpu", "pids", "disk"): how it is enforced."""
    isolation: tuple[str, ...] = ()
    """The isolation mechanisms in place, e.g. ("user", "mount", "pid", ...)."""
    rootless: bool = False
    """True when the backend runs without host root privileges."""
    verification: tuple[str, ...] = ()
    """The verification modes ``sandbox.begin_verification`` supports ("strict", "shared"; see pool.verification)."""
    verifier_isolation: VerifierIsolation = VerifierIsolation.NONE
    """What keeps a shared verifier's processes from the agent's: "signals+ptrace" (neither works
    across), "ptrace" (tracing and memory access do not, signals do), or "none"."""
    sandbox_location: Location = Location.NODE
    """Where sandboxes live: "node" (on the machine of the process that made them, so a pool
    keeps warm sandboxes per node) or "remote" (a service every node reaches, so one warm set
    serves the whole cluster)."""
    snapshot_location: Location = Location.NODE
    """Where snapshots live: "node" (this machine's store or engine: every node builds its own,
    and the pool checks that they agree) or "remote" (a registry or provider every node shares)."""
    bases: tuple[str, ...] = ()
    """What a template may start from: "host" (the host userland), "rootfs" (a root filesystem
    folder or tarball), "image" (an OCI image: a registry reference or an archive), "dockerfile"
    (a Dockerfile built by the backend)."""
    gpu_types: tuple[str, ...] = ()
    """GPU models sandboxes can get (empty with ``gpu``: any, unnamed)."""
    changes: ChangesSource = ChangesSource.NONE
    """Who lists what an episode changed (``sandbox.changes()``, see pool.changes): "host" (the
    sandbox's writable layer, read on the host), "engine" (the container engine) or "none" (no
    listing the agent could not forge: ``changes()`` raises UnsupportedError)."""
    shell_session: bool = False
    """``sandbox.shell()`` runs commands in one persistent shell per episode (False: it raises
    UnsupportedError, and ``snapgym/Shell-v0`` starts a new bash per step, carrying the working
    directory and exported variables over in a file)."""

    def __post_init__(self) -> None:
        """Turn plain strings into the fields' Enums (a StrEnum keeps the string form in records and
        reports); an unknown value fails here, naming the valid ones.

        Backends pass the Enums. A string that reaches a field all the same (a record read back
        untyped) is turned into its Enum: once built, every field holds the Enum.
        """
        for name, kind in _CLOSED.items():
            value = getattr(self, name)
            if not isinstance(value, kind):
                try:
                    object.__setattr__(self, name, kind(value))
                except ValueError:
                    valid = ", ".join(repr(member.value) for member in kind)
                    raise ValueError(f"Capabilities.{name}={value!r}: not one of {valid}") from None

    def table_row(self) -> dict[str, str]:
        """The capabilities as short strings, for the README's table and reports."""
        limits = ", ".join(f"{name}: {how.value}" for name, how in sorted(self.limits.items()))
        return {
            "restore": "in place" if self.in_place_restore else "by replacement (a warm spare)",
            "memory snapshot": "yes" if self.memory_snapshot else "files only",
            "fork": "yes" if self.fork else "no",
            "GPU": ", ".join(self.gpu_types) or "yes" if self.gpu else "no",
            "egress": f"{self.egress_control} ({', '.join(self.network_modes)})"
            + ("; every attempt audited" if self.egress_audit else ""),
            "build network": ", ".join(self.build_network_modes),
            "limits": limits or "none",
            "verification": ", ".join(self.verification) or "none",
            "shared verifier kept from the agent's processes by": self.verifier_isolation,
            "isolation": ", ".join(self.isolation) or "none",
            "sandboxes": self.sandbox_location,
            "snapshots": self.snapshot_location,
            "bases": ", ".join(self.bases),
            "end-state diff": self.changes,
            "shell session": "yes" if self.shell_session else "no",
        }
