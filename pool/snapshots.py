"""Snapshots: immutable, content-digested states a sandbox can start from."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pool.errors import SnapshotError


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A known-good filesystem state and the settings episodes run with.

    ``digest`` is a Merkle hash of the content (paths, modes, owners, file
    contents, link targets, over every layer and the base), computed once when
    the snapshot is made. Two sandboxes whose ``start_digest`` is equal started
    from identical files.
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

    def to_json(self) -> str:
        """Serialise for the snapshot store."""
        data = asdict(self)
        data["layers"] = list(self.layers)
        data["env"] = dict(self.env)
        return json.dumps(data, sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        """Load from the snapshot store; a corrupt record raises SnapshotError."""
        try:
            data: dict[str, Any] = json.loads(text)
            data["layers"] = tuple(data["layers"])
            return cls(**data)
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"snapshot record is corrupt ({exc}); delete it and build again") from exc
