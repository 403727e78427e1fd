"""The snapshots of the Daytona stand-in (tests/backends/cloud/daytona/standin.py): what creates start from, and the
``/snapshots`` resource. PYTEST_DONT_REWRITE.

A snapshot is ``active`` from the moment it exists (Daytona's from-sandbox snapshots are too). Names
are unique: a second ``create_snapshot`` with a taken name is dropped without an error, as the API
drops it (its background job fails on the unique name). Listing gives the organization's newest
first and the general ones (:data:`~daytona_control.DEFAULT_SNAPSHOT`) last, 10 a page unless
``limit`` says otherwise; deleting takes an id (the SDK looks a name up first) and refuses general
snapshots.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pool import Snapshot
from tests.backends.cloud.daytona.lifecycle import DEFAULT_RESOURCES, ORGANIZATION_ID
from tests.backends.cloud.daytona.wire import api_error, iso
from tests.backends.cloud.http_standin import Reply, Request, json_reply

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """A snapshot sandboxes can start from."""

    snapshot_id: str
    name: str
    state: str
    general: bool
    """True for the stand-in's own (the default); those cannot be deleted."""
    source_sandbox_id: str | None
    local: Snapshot
    resources: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_RESOURCES))
    """``cpu``, ``gpu``, ``memory``, ``disk``: what every sandbox created from it gets (a snapshot of a
    sandbox keeps the sandbox's)."""


@dataclass(slots=True)
class SnapshotEntry:
    id: str
    name: str
    local: Snapshot
    general: bool
    created_at: float
    source_sandbox_id: str | None = None
    image_name: str | None = None
    sandbox_class: str = "container"
    resources: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_RESOURCES))

    def record(self) -> SnapshotRecord:
        return SnapshotRecord(
            self.id, self.name, "active", self.general, self.source_sandbox_id, self.local, dict(self.resources)
        )

    def json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "organizationId": None if self.general else ORGANIZATION_ID,
            "general": self.general,
            "name": self.name,
            "imageName": self.image_name,
            "state": "active",
            "size": None,
            "entrypoint": None,
            "cpu": self.resources["cpu"],
            "gpu": self.resources["gpu"],
            "mem": self.resources["memory"],
            "disk": self.resources["disk"],
            "errorReason": None,
            "createdAt": iso(self.created_at),
            "updatedAt": iso(self.created_at),
            "lastUsedAt": iso(self.created_at),
            "regionIds": ["us"],
            "ref": f"standin/{self.local.id}",
            "sourceSandboxId": self.source_sandbox_id,
            "sandboxClass": self.sandbox_class,
        }


class SnapshotRegistry:
    """The snapshots by id; :attr:`routes` answer ``/snapshots``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, SnapshotEntry] = {}
        self.routes: list[tuple[str, re.Pattern[str], Callable[..., Reply]]] = [
            ("GET", re.compile(r"/snapshots"), self._list),
            ("GET", re.compile(r"/snapshots/([^/]+)"), self._get),
            ("DELETE", re.compile(r"/snapshots/([^/]+)"), self._delete),
            ("POST", re.compile(r"/snapshots"), lambda r: api_error(r, 400, "the stand-in builds no images")),
        ]

    def add(
        self,
        name: str,
        local: Snapshot,
        *,
        general: bool = False,
        source_sandbox_id: str | None = None,
        sandbox_class: str = "container",
        resources: dict[str, int] | None = None,
    ) -> bool:
        """Register a snapshot; False (and nothing registered) when the name is taken."""
        entry = SnapshotEntry(str(uuid.uuid4()), name, local, general, time.time(), source_sandbox_id)
        entry.resources = dict(resources or DEFAULT_RESOURCES)
        entry.image_name, entry.sandbox_class = ("daytonaio/sandbox:standin" if general else None), sandbox_class
        with self._lock:
            if any(e.name == name for e in self._entries.values()):
                return False
            self._entries[entry.id] = entry
        return True

    def find(self, id_or_name: str) -> SnapshotEntry | None:
        with self._lock:
            return next((e for e in self._entries.values() if id_or_name in (e.name, e.id)), None)

    def records(self) -> dict[str, SnapshotRecord]:
        """By name."""
        with self._lock:
            return {e.name: e.record() for e in self._entries.values()}

    def _list(self, request: Request) -> Reply:
        page, limit = int(request.arg("page") or 1), int(request.arg("limit") or 10)
        name, source = (request.arg("name") or "").lower(), request.arg("sourceSandboxId")
        with self._lock:
            found = [
                e for e in self._entries.values() if name in e.name.lower() and source in (None, e.source_sandbox_id)
            ]
        found.sort(key=lambda e: (e.general, -e.created_at))
        items = [e.json() for e in found[(page - 1) * limit : page * limit]]
        pages = max(1, -(-len(found) // limit))
        return json_reply(200, {"items": items, "total": len(found), "page": page, "totalPages": pages})

    def _get(self, request: Request, id_or_name: str) -> Reply:
        entry = self.find(id_or_name)
        if entry is None:
            return api_error(request, 404, f"Snapshot {id_or_name} not found")
        return json_reply(200, entry.json())

    def _delete(self, request: Request, snapshot_id: str) -> Reply:
        if not _UUID.fullmatch(snapshot_id):
            return api_error(request, 400, "Validation failed (uuid is expected)")
        with self._lock:
            entry = self._entries.get(snapshot_id)
            if entry is None:
                return api_error(request, 404, f"Snapshot {snapshot_id} not found")
            if entry.general:
                return api_error(request, 403, "general snapshots cannot be deleted")
            del self._entries[snapshot_id]
        return Reply(200)
