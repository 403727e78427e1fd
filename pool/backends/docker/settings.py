"""The Docker backend's options, settled once: what every sandbox and build of one backend runs under.

A frozen value, so a sandbox can hold it without holding its backend: the limits a snapshot's
resources turn into, the defaults of exec, whether restores hand off to prewarmed spares, the
image names' prefix and the labels that say which process owns a container.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pool.backends.docker.transport.containers import Limits
from pool.build.registry.references import normalize_host
from pool.errors import ConfigError
from pool.resources import DEFAULT_TIMEOUT_S, Resources

MIB = 1 << 20
_PREFIX = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")


@dataclass(frozen=True, slots=True)
class DockerRegistry:
    """How the Docker backend pulls images it does not have (the engine's own logins, CAs and
    ``insecure-registries`` apply: credentials are ``docker login`` on the engine's machine)."""

    mirrors: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Registry host (``docker.io`` for Docker Hub) -> mirror hosts (``host[:port]``), pulled from in
    order before the registry itself; what a mirror gave is tagged with the name the task used."""

    def __post_init__(self) -> None:
        mirrors = {}
        for host, hosts in dict(self.mirrors).items():
            listed = [hosts] if isinstance(hosts, str) else list(hosts)
            if not listed or not all(isinstance(h, str) and h and "/" not in h for h in listed):
                raise ConfigError(
                    f"DockerBackend(registry.mirrors[{host!r}]) must list mirror hosts as host[:port] "
                    f"(no scheme or path), got {hosts!r}"
                )
            mirrors[normalize_host(str(host))] = tuple(listed)
        object.__setattr__(self, "mirrors", mirrors)

    @classmethod
    def parse(cls, value: DockerRegistry | Mapping[str, Any] | None) -> DockerRegistry:
        """The settings from a mapping of their fields (None: the defaults).

        Raises:
            ConfigError: a key other than ``mirrors`` (naming it), or a bad mirror.
        """
        if value is None or isinstance(value, DockerRegistry):
            return value or cls()
        unknown = sorted(set(value) - {"mirrors"})
        if unknown:
            raise ConfigError(
                f"DockerBackend(registry=...) takes only 'mirrors', not {', '.join(map(repr, unknown))}; the "
                "engine's own settings give credentials (docker login), CAs and insecure registries (daemon.json)"
            )
        return cls(**value)


@dataclass(frozen=True, slots=True)
class DockerSettings:
    """One Docker backend's options as its sandboxes and builds see them (see DockerBackend for each)."""

    owner: str
    """The label value that marks this process's containers and checkpoints (see pool.labels)."""
    memory_limit_mb: int | None = 2048
    cpus: float | None = None
    pids_limit: int | None = 1024
    disk_limit_mb: int | None = 1024
    max_output_bytes: int = MIB
    default_timeout_s: float | None = DEFAULT_TIMEOUT_S
    prewarm: bool = True
    image_prefix: str = "snapgym"
    prefer_prebuilt: bool = True
    shared_verification: bool = False
    host_binds: tuple[tuple[str, str], ...] = ()
    """(host path, container path) pairs the host base binds read-only into a container (the host view)."""

    def __post_init__(self) -> None:
        for name in ("memory_limit_mb", "cpus", "pids_limit", "disk_limit_mb", "max_output_bytes", "default_timeout_s"):
            check_positive(name, getattr(self, name))
        if not isinstance(self.image_prefix, str) or not _PREFIX.match(self.image_prefix):
            raise ConfigError(
                f"DockerBackend(image_prefix={self.image_prefix!r}) must be a repository name: lowercase letters, "
                "digits, '.', '_', '-', and '/' between parts"
            )

    def limits(self, resources: Resources, *, disk: bool = True) -> Limits:
        """A snapshot's resources, the backend's options where it sets none (``disk=False``: no
        disk limit, for a template's build container)."""
        return Limits(
            memory_mb=resources.memory_mb or self.memory_limit_mb,
            cpus=resources.cpus or self.cpus,
            pids=self.pids_limit,
            disk_mb=(resources.storage_mb or self.disk_limit_mb) if disk else None,
        )


def check_positive(name: str, value: float | None) -> None:
    """Refuse an option that must be positive or None.

    Raises:
        ConfigError: zero, negative, or a bool.
    """
    if value is not None and (isinstance(value, bool) or not value > 0):
        raise ConfigError(f"DockerBackend({name}=...) must be positive or None, got {value!r}")
