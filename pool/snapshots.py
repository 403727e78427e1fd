"""Snapshots: immutable, content-digested states a sandbox can start from."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pool.errors import ConfigError, SnapshotError
from pool.resources import Resources

BASE_ENV: Mapping[str, str] = {
    "HOME": "/root",
    "USER": "root",
    "LOGNAME": "root",
    "SHELL": "/bin/sh",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "HOSTNAME": "sandbox",
    "TZ": "UTC",
}
"""The environment every exec starts from on every backend, under the snapshot's ``env``."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A known-good filesystem state and the settings episodes run with.

    ``digest`` is a hash of the content (paths, modes, owners, file contents,
    link targets, hard-link groups, over every layer and the base; see
    :mod:`pool.build.digest`), computed when the snapshot is made. Backends check the
    content against it before a sandbox starts from it, so two sandboxes whose
    ``start_digest`` is equal started from identical files.
    """

    id: str
    """Unique name: the template's content hash, or a digest for mid-episode snapshots."""
    digest: str
    """Merkle digest of the content."""
    backend: str
    """The backend that made it (snapshots do not move between backends)."""
    layers: tuple[str, ...] = ()
    """Backend-specific layer ids, bottom first."""
    base: str = "host"
    """The base the layers stand on."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment of every exec."""
    workdir: str = "/"
    """Default working directory of every exec."""
    template: str | None = None
    """Name of the template it was built from, if any."""
    parent: str | None = None
    """Id of the snapshot a mid-episode snapshot was taken over."""
    created_at: float = 0.0
    """Unix time of creation."""
    resources: Resources = field(default_factory=Resources)
    """What each sandbox started from it gets (the template's; checkpoints keep their parent's)."""
    build_network: Mapping[str, Any] = field(default_factory=dict)
    """What the build's commands could and did reach: the build policy, the route that realised it
    and, through the egress proxy, the attempts summarised (see pool.build.network). Empty for
    mid-episode snapshots. Not part of the content digest."""
    unapplied: tuple[str, ...] = ()
    """What the template asks for that the backend does not hold its sandboxes to (``storage_mb=10240``
    on a provider without a disk setting): said in every episode's ``info``, never silently dropped."""

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values."""
        data = asdict(self)
        data["layers"] = list(self.layers)
        data["unapplied"] = list(self.unapplied)
        data["env"] = dict(self.env)
        data["resources"] = self.resources.fingerprint()
        data["build_network"] = dict(self.build_network)
        return data

    def to_json(self) -> str:
        """Serialise for the snapshot store."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Snapshot:
        """Build from :meth:`to_dict` output; a corrupt one raises SnapshotError."""
        try:
            fields = dict(data)
            fields["layers"] = tuple(fields["layers"])
            fields["unapplied"] = tuple(fields.get("unapplied", ()))
            fields["resources"] = Resources.from_dict(fields.get("resources"))
            return cls(**fields)
        except (KeyError, TypeError, ConfigError) as exc:
            raise SnapshotError(f"snapshot record is corrupt ({exc}); delete it and build again") from exc

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        """Load from the snapshot store; a corrupt record raises SnapshotError."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise SnapshotError(f"snapshot record is corrupt ({exc}); delete it and build again") from exc
        if not isinstance(data, dict):
            raise SnapshotError("snapshot record is corrupt (not an object); delete it and build again")
        return cls.from_dict(data)
