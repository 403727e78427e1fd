"""Templates: the recipe for a known-good state, named by a content hash."""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pool.errors import ConfigError

HOST_BASE = "host"


@dataclass(frozen=True, slots=True)
class Template:
    """What a snapshot is built from.

    ``backend.build(template)`` starts a sandbox over ``base``, runs ``setup``
    in order, places ``files``, runs ``healthcheck``, and freezes the result.
    Building the same template again is a cache hit: the snapshot id is a hash
    of every field here plus the identity of the base.
    """

    name: str
    """A human name; part of the hash, so two names give two snapshots."""
    base: str = HOST_BASE
    """``"host"`` (a read-only view of the host userland and Python), or the
    path of a root filesystem directory or tarball (e.g. ``docker export``)."""
    setup: Sequence[str] = ()
    """Shell commands run in order as root inside the sandbox, in ``workdir``."""
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    """Files to place after setup: absolute path in the sandbox -> content."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables for setup and for every exec in episodes."""
    workdir: str = "/"
    """Default working directory; created before setup runs."""
    healthcheck: str | None = None
    """A command that must exit 0 before the snapshot is accepted."""
    network: bool = False
    """Whether setup may use the host network (episodes never do)."""
    setup_timeout_s: float = 600.0
    """Timeout of each setup step and of the healthcheck."""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ConfigError("Template.name must be a non-empty string")
        if isinstance(self.setup, str):
            raise ConfigError("Template.setup must be a list of commands, not one string: wrap it in [...]")
        object.__setattr__(self, "setup", tuple(self.setup))
        object.__setattr__(self, "files", dict(self.files))
        object.__setattr__(self, "env", {str(k): str(v) for k, v in dict(self.env).items()})
        if not posixpath.isabs(self.workdir):
            raise ConfigError(f"Template.workdir must be an absolute path, got {self.workdir!r}")
        for path in self.files:
            if not posixpath.isabs(path):
                raise ConfigError(f"Template.files keys must be absolute paths, got {path!r}")
        for key in self.env:
            if not key or "=" in key or "\0" in key:
                raise ConfigError(f"Template.env has an invalid variable name {key!r}")
        if self.setup_timeout_s <= 0:
            raise ConfigError("Template.setup_timeout_s must be positive")

    def fingerprint(self) -> dict[str, Any]:
        """The fields that define the template's content, as JSON-ready data."""
        return {
            "name": self.name,
            "base": self.base,
            "setup": list(self.setup),
            "files": {
                path: hashlib.sha256(_as_bytes(content)).hexdigest() for path, content in sorted(self.files.items())
            },
            "env": dict(sorted(self.env.items())),
            "workdir": self.workdir,
            "healthcheck": self.healthcheck,
            "network": self.network,
        }

    def content_hash(self, base_identity: str) -> str:
        """A hex digest naming the snapshot this template builds over a base."""
        payload = json.dumps({"template": self.fingerprint(), "base": base_identity}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()


def _as_bytes(content: str | bytes) -> bytes:
    return content.encode() if isinstance(content, str) else bytes(content)
