"""How image fetches reach registries: credentials, mirrors, plain-HTTP hosts, CAs, platform.

Fetches are hermetic: they read none of the host's container configuration
(``docker login`` files, ``registries.conf`` mirrors, ``policy.json``,
``certs.d``) unless these settings name it, so the same settings fetch the same
way under any user. The default is anonymous access to public registries over
verified TLS, for this machine's platform.
"""

from __future__ import annotations

import dataclasses
import platform as _platform
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pool.build.registry.source import normalize_host
from pool.errors import ConfigError

_ARCHES = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "armv7l": "arm/v7",
    "armv6l": "arm/v6",
    "i686": "386",
    "i386": "386",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}
_PLATFORM = re.compile(r"^[a-z0-9]+/[a-z0-9_]+(?:/[a-z0-9]+)?$")
_HOST = re.compile(r"^[a-z0-9.-]+(?::\d+)?$|^\[[0-9a-f:]+\](?::\d+)?$")


def default_platform() -> str:
    """This machine's platform as images name it: ``linux/amd64``, ``linux/arm64``..."""
    machine = _platform.machine().lower()
    return f"linux/{_ARCHES.get(machine, machine)}"


@dataclass(frozen=True, slots=True)
class Credentials:
    """A user name and password (or access token) for one registry."""

    username: str
    password: str = field(repr=False)
    """Never logged, never on a command line: written to a private 0600 auth file for each fetch."""


@dataclass(frozen=True, slots=True)
class RegistrySettings:
    """How to reach registries. Anonymous, verified TLS, no mirrors, this machine's platform by default."""

    auth_file: Path | None = None
    """A containers-auth.json or Docker ``config.json`` (e.g. ``~/.docker/config.json`` after
    ``docker login``). None: no credentials besides ``credentials``; the host's logins are not read."""
    credentials: Mapping[str, Credentials] = field(default_factory=dict, repr=False)
    """Registry host (``registry.example.com:5000``; ``docker.io`` for Docker Hub) -> its credentials;
    they take precedence over the auth file's entry for that host."""
    mirrors: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Registry host -> mirror hosts, tried in order before the registry itself (by tag and by digest)."""
    insecure_registries: Sequence[str] = ()
    """Hosts (registries or mirrors) reached over plain HTTP, or over TLS without verifying the certificate."""
    ca_dirs: Sequence[Path] = ()
    """Folders of extra CA certificates (``*.crt``), and client certificates (``*.cert`` with ``*.key``),
    used for every registry besides the system's trusted CAs."""
    platform: str = field(default_factory=default_platform)
    """``os/arch[/variant]`` to pick from multi-platform images; an image for another platform is refused."""
    policy: Path | None = None
    """A containers-policy.json whose signature rules every fetch must pass. None: any image is accepted
    as such; snapgym trusts content by digest, so pin images with ``@sha256:`` where it matters."""
    timeout_s: float = 1800.0
    """The longest one skopeo command (an inspect or a copy) may run."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "auth_file", _path_or_none(self.auth_file, "auth_file"))
        set_(self, "policy", _path_or_none(self.policy, "policy"))
        creds = {}
        for host, cred in dict(self.credentials).items():
            if not isinstance(cred, Credentials):
                raise ConfigError(f"RegistrySettings.credentials[{host!r}] must be a Credentials(username, password)")
            if not cred.username or ":" in cred.username:
                raise ConfigError(f"RegistrySettings.credentials[{host!r}]: the user name must be set and hold no ':'")
            creds[_host(host, "credentials")] = cred
        set_(self, "credentials", creds)
        mirrors = {}
        for host, hosts in dict(self.mirrors).items():
            if isinstance(hosts, str):
                raise ConfigError(f"RegistrySettings.mirrors[{host!r}] must be a list of hosts, not one string")
            mirrors[_host(host, "mirrors")] = tuple(_host(m, "mirrors") for m in hosts)
        set_(self, "mirrors", mirrors)
        if isinstance(self.insecure_registries, str):
            raise ConfigError("RegistrySettings.insecure_registries must be a list of hosts, not one string")
        set_(self, "insecure_registries", tuple(_host(h, "insecure_registries") for h in self.insecure_registries))
        set_(self, "ca_dirs", tuple(Path(d).expanduser() for d in self.ca_dirs))
        if not _PLATFORM.match(self.platform):
            raise ConfigError(f"RegistrySettings.platform must be os/arch[/variant], got {self.platform!r}")
        if not self.timeout_s > 0:
            raise ConfigError("RegistrySettings.timeout_s must be positive")

    @property
    def os(self) -> str:
        """The platform's operating system (``linux``)."""
        return self.platform.split("/")[0]

    @property
    def arch(self) -> str:
        """The platform's architecture (``amd64``)."""
        return self.platform.split("/")[1]

    @property
    def variant(self) -> str | None:
        """The platform's architecture variant (``v7`` of ``linux/arm/v7``), if any."""
        parts = self.platform.split("/")
        return parts[2] if len(parts) > 2 else None


def _host(host: str, what: str) -> str:
    normal = normalize_host(str(host))
    if not _HOST.match(normal):
        raise ConfigError(
            f"RegistrySettings.{what}: {host!r} is not a registry host (write host[:port], no scheme or path)"
        )
    return normal


def _path_or_none(value: Path | str | None, what: str) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise ConfigError(f"RegistrySettings.{what}: {path} is not a file")
    return path


def registry_settings(value: RegistrySettings | Mapping[str, Any] | None) -> RegistrySettings:
    """RegistrySettings from themselves, a mapping of their fields (a YAML backend option), or None.

    Raises:
        ConfigError: a field RegistrySettings does not have (naming the valid ones).
    """
    if value is None:
        return RegistrySettings()
    if isinstance(value, RegistrySettings):
        return value
    known = {f.name for f in dataclasses.fields(RegistrySettings)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ConfigError(
            f"LocalBackend(registry=...) has no field {', '.join(unknown)}; its fields: {', '.join(sorted(known))}"
        )
    fields = dict(value)
    credentials = fields.get("credentials") or {}
    fields["credentials"] = {
        host: Credentials(**cred) if isinstance(cred, Mapping) else cred for host, cred in dict(credentials).items()
    }
    return RegistrySettings(**fields)
