"""The local backend's options, settled once: what every sandbox of one backend runs under.

A frozen value, so a sandbox can hold it without holding its backend: the limits a snapshot's
resources turn into, the user-id mapping, the size of the writable layer, the defaults of exec.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from pool.backends.local.cgroups import Limits
from pool.build import hostview
from pool.build.hostview import HostView
from pool.errors import ConfigError
from pool.resources import Resources
from pool.snapshots import BASE_ENV, Snapshot
from pool.templates import HOST_BASE

MIB = 1 << 20
_POSITIVE = (
    "memory_limit_mb",
    "cpus",
    "pids_limit",
    "disk_limit_mb",
    "max_snapshot_mb",
    "max_output_bytes",
    "default_timeout_s",
)
"""The options that must be positive (or None)."""
ID_RANGE = 65536
"""How many user and group ids a root-mode sandbox maps (from ``id_offset`` on)."""


@dataclass(frozen=True, slots=True)
class LocalSettings:
    """One local backend's options as its sandboxes see them (see LocalBackend for each)."""

    tag: str
    """The backend instance's name: sandbox ids, its runtime folder and cgroups carry it."""
    rootless: bool
    id_offset: int
    """The host uid that sandbox root maps to (0 when rootless: the caller's own)."""
    memory_limit_mb: int | None
    cpus: float | None
    pids_limit: int | None
    disk_limit_mb: int
    max_snapshot_mb: int
    max_output_bytes: int
    default_timeout_s: float | None
    prewarm: bool
    cgroup_controllers: frozenset[str]
    """The cgroup controllers this machine lets the backend use (none when rootless)."""
    host: HostView
    """What the host base binds into a sandbox."""

    def __post_init__(self) -> None:
        for name in _POSITIVE:
            check_positive(name, getattr(self, name))

    def limits(self, resources: Resources) -> Limits:
        """A snapshot's resources, the backend's options where it sets none."""
        memory_mb = resources.memory_mb or self.memory_limit_mb
        return Limits(
            memory_bytes=memory_mb * MIB if memory_mb else None,
            cpus=resources.cpus or self.cpus,
            pids=self.pids_limit,
        )

    def limited_controllers(self, resources: Resources) -> set[str]:
        """The hierarchies a sandbox's instances get a cgroup in: only those with a limit to enforce."""
        limits = self.limits(resources)
        wanted = {"memory": limits.memory_bytes, "pids": limits.pids, "cpu": limits.cpus}
        return {name for name in self.cgroup_controllers if wanted.get(name)}

    def rlimits(self, resources: Resources) -> list[str]:
        """The daemon's ``rlimit`` fields: no core dumps, and what no cgroup enforces."""
        specs = [f"{resource.RLIMIT_CORE}:0:0"]
        limits = self.limits(resources)
        if "pids" not in self.cgroup_controllers and limits.pids:
            specs.append(f"{resource.RLIMIT_NPROC}:{limits.pids}:{limits.pids}")
        if "memory" not in self.cgroup_controllers and limits.memory_bytes:
            specs.append(f"{resource.RLIMIT_DATA}:{limits.memory_bytes}:{limits.memory_bytes}")
        return specs

    def disk_bytes(self, snapshot: Snapshot) -> int:
        """The size of the writable layer of a sandbox at ``snapshot``."""
        return (snapshot.resources.storage_mb or self.disk_limit_mb) * MIB

    @property
    def root_uid(self) -> str:
        """The host uid of sandbox root, as the daemon's ``root_uid`` field."""
        return str(self.id_offset) if not self.rootless else "0"

    def id_maps(self) -> list[tuple[str, str]]:
        """The daemon's ``uid_map`` and ``gid_map`` fields."""
        if self.rootless:
            return [("uid_map", "0 0 1"), ("gid_map", "0 0 1")]
        mapping = f"0 {self.id_offset} {ID_RANGE}"
        return [("uid_map", mapping), ("gid_map", mapping)]

    def base_env(self, snapshot: Snapshot) -> dict[str, str]:
        """The environment every exec starts from, before the snapshot's own."""
        path = self.host.path_env if snapshot.base == HOST_BASE else hostview.DEFAULT_PATH
        return {"PATH": path, **BASE_ENV}


def check_positive(name: str, value: float | None) -> None:
    """Refuse an option that must be positive (or None) and is not.

    Raises:
        ConfigError: naming the option and its value.
    """
    if value is not None and not value > 0:
        raise ConfigError(f"LocalBackend({name}=...) must be positive or None, got {value!r}")
