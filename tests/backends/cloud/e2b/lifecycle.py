"""Sandboxes as the E2B stand-in (tests/backends/cloud/e2b/standin.py) keeps them: their records, their states,
the lifetime the reaper enforces, pausing, and the JSON the API answers with. PYTEST_DONT_REWRITE.

A sandbox is ``running`` (a live local sandbox), ``paused`` (its files kept as a local snapshot,
its processes gone) or ``killed``. Past its ``end_at`` the reaper kills it, or pauses it if it was
created with ``autoPause``.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pool import LocalBackend, Snapshot
from pool.backends.local import LocalSandbox
from tests.backends.cloud.e2b.wire import new_id, rfc3339

ENVD_VERSION = "0.6.7"
"""The envd version the stand-in advertises (octet-stream uploads, file metadata, no default user sent)."""
CLIENT_ID = "e2b-standin"


@dataclass(frozen=True, slots=True)
class SandboxRecord:
    """An E2B sandbox as the stand-in knows it, live or not."""

    sandbox_id: str
    template_id: str
    metadata: dict[str, str]
    envs: dict[str, str]
    started_at: float
    end_at: float
    """Unix time the lifetime ends (the reaper kills, or with ``autoPause`` pauses, past it)."""
    state: str
    """``running``, ``paused`` or ``killed``."""
    ended_by: str | None = None
    """What killed it: ``api`` (kill), ``timeout`` (the reaper) or ``close`` (the stand-in closed)."""
    network: tuple[dict[str, Any], ...] = ()
    """The egress settings as sent, oldest first: the create's ``allow_internet_access`` and ``network``
    fields, then each ``update_network`` body (recorded, not enforced: the local sandboxes have loopback only)."""


@dataclass(slots=True)
class Box:
    """A sandbox's mutable state, guarded by :attr:`Sandboxes.lock`."""

    record: SandboxRecord
    token: str
    alias: str | None
    auto_pause: bool
    local: LocalSandbox | None
    paused: Snapshot | None = None


class Sandboxes:
    """Every sandbox the stand-in started, by id, killed ones included."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.lock = threading.RLock()
        """Guards the sandboxes and every :class:`Box` (re-entrant: handlers hold it around lookups)."""
        self._boxes: dict[str, Box] = {}
        self._created = 0

    @property
    def created_count(self) -> int:
        """Sandboxes opened so far."""
        with self.lock:
            return self._created

    def records(self) -> dict[str, SandboxRecord]:
        with self.lock:
            return {sid: box.record for sid, box in self._boxes.items()}

    def boxes(self) -> list[Box]:
        with self.lock:
            return list(self._boxes.values())

    def get(self, sandbox_id: str) -> Box:
        """The sandbox ``sandbox_id``, killed or not (KeyError: none)."""
        with self.lock:
            return self._boxes[sandbox_id]

    def live(self, sandbox_id: str) -> Box | None:
        """The sandbox ``sandbox_id`` unless it is unknown or killed."""
        with self.lock:
            box = self._boxes.get(sandbox_id)
            return box if box is not None and box.record.state != "killed" else None

    def open(
        self,
        local: LocalSandbox,
        *,
        template_id: str,
        alias: str | None,
        timeout_s: float,
        metadata: Mapping[str, str],
        envs: Mapping[str, str],
        auto_pause: bool,
    ) -> Box:
        """A new running sandbox over ``local``, with ``timeout_s`` to live."""
        now = time.time()
        record = SandboxRecord(
            sandbox_id=new_id(),
            template_id=template_id,
            metadata=dict(metadata),
            envs=dict(envs),
            started_at=now,
            end_at=now + timeout_s,
            state="running",
        )
        box = Box(record, token=secrets.token_urlsafe(24), alias=alias, auto_pause=auto_pause, local=local)
        with self.lock:
            self._boxes[record.sandbox_id] = box
            self._created += 1
        return box

    def end(self, box: Box, ended_by: str) -> None:
        """Kill ``box`` (a no-op if it is killed already)."""
        with self.lock:
            if box.record.state == "killed":
                return
            local, box.local, box.paused = box.local, None, None
            box.record = replace(box.record, state="killed", ended_by=ended_by)
        if local is not None:
            local.close()

    def end_all(self, ended_by: str) -> None:
        for box in self.boxes():
            self.end(box, ended_by)

    def pause(self, box: Box) -> bool:
        """Keep the files of a running sandbox and end it (False: it is not running)."""
        with self.lock:
            local = box.local
            if local is None:
                return False
            box.local = None
        snapshot = local.snapshot()
        local.close()
        with self.lock:
            if box.record.state == "running":  # not killed meanwhile
                box.paused = snapshot
                box.record = replace(box.record, state="paused")
        return True

    def reap(self) -> None:
        """Kill (or, with ``autoPause``, pause) the running sandboxes past their lifetime."""
        now = time.time()
        with self.lock:
            due = [b for b in self._boxes.values() if b.record.state == "running" and b.record.end_at <= now]
        for box in due:
            with contextlib.suppress(Exception):  # the reaper must outlive a sandbox that fails to close
                if not (box.auto_pause and self.pause(box)):
                    self.end(box, "timeout")

    def info_json(self, box: Box, *, detail: bool) -> dict[str, Any]:
        """The API's ``SandboxDetail`` (``detail``: with the access token) or ``ListedSandbox``."""
        info = {
            "templateID": box.record.template_id,
            "sandboxID": box.record.sandbox_id,
            "clientID": CLIENT_ID,
            "alias": box.alias,
            "startedAt": rfc3339(box.record.started_at),
            "endAt": rfc3339(box.record.end_at),
            "cpuCount": 1,
            "memoryMB": self.backend.memory_limit_mb or 512,
            "diskSizeMB": self.backend.disk_limit_mb,
            "state": box.record.state,
            "envdVersion": ENVD_VERSION,
            "metadata": box.record.metadata,
        }
        if detail:
            info["envdAccessToken"] = box.token
        return info


def created_json(box: Box) -> dict[str, Any]:
    """The API's ``Sandbox``, as create, fork and connect answer it."""
    return {
        "templateID": box.record.template_id,
        "sandboxID": box.record.sandbox_id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": box.token,
        "alias": box.alias,
        "domain": None,
    }
