"""The control plane of the E2B stand-in (tests/backends/cloud/e2b/standin.py): sandboxes (create, list, info,
kill, timeout, network, fork, pause and connect), snapshots and templates, and the create rate
limit. Authentication, faults and the request log are the stand-in's. PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qsl, unquote

from pool import LocalBackend, Snapshot
from pool.network.policy import NetworkPolicy, Phase
from tests.backends.cloud.e2b.lifecycle import Sandboxes, created_json
from tests.backends.cloud.e2b.templates import TemplateBuilds
from tests.backends.cloud.e2b.wire import api_error, new_id
from tests.backends.cloud.http_standin import Reply, Request, json_reply

MAX_FORKS = 20


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """A snapshot made by ``create_snapshot``."""

    snapshot_id: str
    names: list[str]
    sandbox_id: str
    """The sandbox it was taken of."""
    local: Snapshot


class ControlPlane:
    """E2B's sandboxes, snapshots and templates over a local backend; the settings are the stand-in's.

    Args:
        default_timeout_s: a sandbox's lifetime when create does not say.
        max_creates_per_s: answer 429 to creates (and forks) past this many in the last second.
        rate_limit_retry_after_s: the ``Retry-After`` of that 429 (None: no header).
    """

    def __init__(
        self,
        backend: LocalBackend,
        *,
        default_timeout_s: int,
        max_creates_per_s: float | None,
        rate_limit_retry_after_s: int | None,
    ) -> None:
        self.backend = backend
        self.default_timeout_s = default_timeout_s
        self.max_creates_per_s = max_creates_per_s
        self.rate_limit_retry_after_s = rate_limit_retry_after_s
        self.sandboxes = Sandboxes(backend)
        self._lock = self.sandboxes.lock
        self._create_lock = threading.Lock()
        self._templates: dict[str, tuple[str, Snapshot]] = {}
        """Template name -> its id and snapshot."""
        self._snapshots: dict[str, SnapshotRecord] = {}
        self._idempotent: dict[str, str] = {}
        self._create_times: list[float] = []
        self.routes: list[tuple[str, re.Pattern[str], Callable[..., Reply]]] = [
            ("POST", re.compile(r"/v2/sandboxes"), self._create),
            ("GET", re.compile(r"/v2/sandboxes"), self._list),
            ("GET", re.compile(r"/sandboxes/([^/]+)"), self._info),
            ("DELETE", re.compile(r"/sandboxes/([^/]+)"), self._kill),
            ("POST", re.compile(r"/sandboxes/([^/]+)/timeout"), self._set_timeout),
            ("PUT", re.compile(r"/sandboxes/([^/]+)/network"), self._update_network),
            ("POST", re.compile(r"/sandboxes/([^/]+)/snapshots"), self._create_snapshot),
            ("POST", re.compile(r"/sandboxes/([^/]+)/fork"), self._fork),
            ("POST", re.compile(r"/sandboxes/([^/]+)/pause"), self._pause),
            ("POST", re.compile(r"/v2/sandboxes/([^/]+)/connect"), self._connect),
            ("GET", re.compile(r"/sandboxes/([^/]+)/metrics"), lambda req, sid: json_reply(200, [])),
            ("GET", re.compile(r"/snapshots"), self._list_snapshots),
            ("DELETE", re.compile(r"/templates/([^/]+)"), self._delete_snapshot),
        ]
        """(method, path pattern, handler): the handler gets the request and the unquoted groups."""
        self.templates = TemplateBuilds(backend, self._add_built, self._lock)
        self.routes += [(method, re.compile(path), handler) for method, path, handler in self.templates.routes]

    def snapshots(self) -> dict[str, SnapshotRecord]:
        with self._lock:
            return dict(self._snapshots)

    def add_template(self, name: str, snapshot: Snapshot) -> None:
        with self._lock:
            self._templates[name] = (new_id(), snapshot)

    def _add_built(self, name: str, template_id: str, snapshot: Snapshot) -> None:
        with self._lock:
            self._templates[name] = (template_id, snapshot)

    # -- sandboxes ---------------------------------------------------------------------------

    def _create(self, request: Request) -> Reply:
        body = request.json_object()
        key = request.headers.get("idempotency-key")
        with self._create_lock:
            with self._lock:
                if key in self._idempotent:
                    return json_reply(201, created_json(self.sandboxes.get(self._idempotent[key])))
            if self._rate_limited(1) < 1:
                return self._rate_limit_reply()
            name = str(body.get("templateID") or "base")
            found = self._resolve_template(name)
            if found is None:
                return api_error(404, f"template '{name}' not found")
            snapshot, template_id, alias = found
            local = self.backend.create(snapshot)
            if body.get("allow_internet_access"):  # as E2B gives it: the internet (through the local proxy)
                local.set_network(NetworkPolicy.public(), phase=Phase.BUILD)
            box = self.sandboxes.open(
                local,
                template_id=template_id,
                alias=alias,
                timeout_s=self._lifetime_s(body.get("timeout")),
                metadata=body.get("metadata") or {},
                envs=body.get("envVars") or {},
                auto_pause=bool(body.get("autoPause")),
            )
            sent: dict[str, Any] = {k: body[k] for k in ("allow_internet_access", "network") if k in body}
            with self._lock:
                box.record = replace(box.record, network=(sent,))
                if key:
                    self._idempotent[key] = box.record.sandbox_id
        return json_reply(201, created_json(box))

    def _list(self, request: Request) -> Reply:
        states = set((request.arg("state") or "running,paused").split(","))
        wanted = {unquote(k): unquote(v) for k, v in parse_qsl(request.arg("metadata", ""))}
        template = request.arg("template")
        with self._lock:
            boxes = [
                box
                for box in self.sandboxes.boxes()
                if box.record.state in states
                and all(box.record.metadata.get(k) == v for k, v in wanted.items())
                and template in (None, box.record.template_id, box.alias)
            ]
        boxes.sort(key=lambda b: b.record.started_at, reverse=request.arg("order") == "desc")
        start = int(request.arg("nextToken") or 0)
        limit = int(request.arg("limit") or 100)
        page = boxes[start : start + limit]
        more = {"x-next-token": str(start + limit)} if start + limit < len(boxes) else {}
        return json_reply(200, [self.sandboxes.info_json(box, detail=False) for box in page], more)

    def _info(self, request: Request, sandbox_id: str) -> Reply:
        box = self.sandboxes.live(sandbox_id)
        if box is None:
            return api_error(404, f"sandbox '{sandbox_id}' not found")
        return json_reply(200, self.sandboxes.info_json(box, detail=True))

    def _kill(self, request: Request, sandbox_id: str) -> Reply:
        box = self.sandboxes.live(sandbox_id)
        if box is None:
            return api_error(404, f"sandbox '{sandbox_id}' not found")
        self.sandboxes.end(box, "api")
        return Reply(204)

    def _set_timeout(self, request: Request, sandbox_id: str) -> Reply:
        timeout_s = int(request.json_object()["timeout"])
        with self._lock:
            box = self.sandboxes.live(sandbox_id)
            if box is None:
                return api_error(404, f"sandbox '{sandbox_id}' not found")
            box.record = replace(box.record, end_at=time.time() + timeout_s)
        return Reply(204)

    def _update_network(self, request: Request, sandbox_id: str) -> Reply:
        with self._lock:
            box = self.sandboxes.live(sandbox_id)
            if box is None:
                return api_error(404, f"sandbox '{sandbox_id}' not found")
            box.record = replace(box.record, network=(*box.record.network, request.json_object()))
        return Reply(204)

    def _fork(self, request: Request, sandbox_id: str) -> Reply:
        body = request.json_object()
        count = int(body.get("count") or 1)
        if not 1 <= count <= MAX_FORKS:
            return api_error(400, f"count must be between 1 and {MAX_FORKS}")
        source = self.sandboxes.live(sandbox_id)
        if source is None or source.local is None:
            return api_error(404, f"sandbox '{sandbox_id}' not found")
        with self._create_lock:
            allowed = self._rate_limited(count)
            locals_ = self.backend.fork(source.local.snapshot(), allowed) if allowed else []
            results: list[dict[str, Any]] = []
            for local in locals_:
                box = self.sandboxes.open(
                    local,
                    template_id=source.record.template_id,
                    alias=source.alias,
                    timeout_s=self._lifetime_s(body.get("timeout")),
                    metadata=source.record.metadata,
                    envs=source.record.envs,
                    auto_pause=source.auto_pause,
                )
                results.append({"sandbox": created_json(box)})
        refused = {"error": {"code": 429, "message": "rate limit exceeded"}}
        return json_reply(201, results + [refused] * (count - allowed))

    def _pause(self, request: Request, sandbox_id: str) -> Reply:
        box = self.sandboxes.live(sandbox_id)
        if box is None:
            return api_error(404, f"sandbox '{sandbox_id}' not found")
        if self.sandboxes.pause(box):
            return Reply(204)
        return api_error(409, f"sandbox '{sandbox_id}' is already paused")

    def _connect(self, request: Request, sandbox_id: str) -> Reply:
        timeout_s = request.json_object().get("timeout")
        box = self.sandboxes.live(sandbox_id)
        if box is None:
            return api_error(404, f"sandbox '{sandbox_id}' not found")
        with self._lock:
            paused = box.paused if box.local is None else None
            resumed = paused is not None
            if paused is not None:
                box.local, box.paused = self.backend.create(paused), None
                end_at = time.time() + (timeout_s or self.default_timeout_s)
                box.record = replace(box.record, state="running", end_at=end_at)
            elif timeout_s:
                box.record = replace(box.record, end_at=max(box.record.end_at, time.time() + timeout_s))
        return json_reply(201 if resumed else 200, created_json(box))

    def _lifetime_s(self, timeout_s: int | None) -> int:
        return timeout_s if timeout_s is not None else self.default_timeout_s

    def _rate_limited(self, wanted: int) -> int:
        """How many of ``wanted`` sandboxes may start now (and count them as started)."""
        now = time.monotonic()
        with self._lock:
            self._create_times = [t for t in self._create_times if now - t < 1.0]
            room = wanted
            if self.max_creates_per_s is not None:
                room = max(0, min(wanted, int(self.max_creates_per_s) - len(self._create_times)))
            self._create_times.extend([now] * room)
            return room

    def _rate_limit_reply(self) -> Reply:
        retry = self.rate_limit_retry_after_s
        headers = {"Retry-After": str(retry)} if retry is not None else {}
        return json_reply(429, {"code": 429, "message": "rate limit exceeded"}, headers)

    # -- snapshots and templates -------------------------------------------------------------

    def _create_snapshot(self, request: Request, sandbox_id: str) -> Reply:
        name = request.json_object().get("name")
        box = self.sandboxes.live(sandbox_id)
        if box is None:
            return api_error(404, f"sandbox '{sandbox_id}' not found")
        local = box.local.snapshot() if box.local is not None else box.paused
        if local is None:
            return api_error(409, f"sandbox '{sandbox_id}' is being paused")
        with self._lock:
            same_name = [s for s in self._snapshots.values() if name and name in s.names]
            snapshot_id = same_name[0].snapshot_id if same_name else new_id()
            record = SnapshotRecord(snapshot_id, [name] if name else [], sandbox_id, local)
            self._snapshots[snapshot_id] = record
        return json_reply(201, {"snapshotID": snapshot_id, "names": record.names})

    def _list_snapshots(self, request: Request) -> Reply:
        sandbox_id, name = request.arg("sandboxID"), request.arg("name")
        with self._lock:
            found = [
                s
                for s in self._snapshots.values()
                if sandbox_id in (None, s.sandbox_id) and name in (None, s.snapshot_id, *s.names)
            ]
        start = int(request.arg("nextToken") or 0)
        limit = int(request.arg("limit") or 100)
        more = {"x-next-token": str(start + limit)} if start + limit < len(found) else {}
        page = [{"snapshotID": s.snapshot_id, "names": s.names} for s in found[start : start + limit]]
        return json_reply(200, page, more)

    def _delete_snapshot(self, request: Request, template_id: str) -> Reply:
        with self._lock:
            for s in list(self._snapshots.values()):
                if template_id in (s.snapshot_id, *s.names):
                    del self._snapshots[s.snapshot_id]
                    return Reply(204)
        return api_error(404, f"template '{template_id}' not found")

    def _resolve_template(self, name: str) -> tuple[Snapshot, str, str | None] | None:
        """The snapshot, template id and alias (name) that ``templateID`` names, or None."""
        with self._lock:
            for alias, (template_id, snapshot) in self._templates.items():
                if name in (alias, template_id):
                    return snapshot, template_id, alias
            for s in self._snapshots.values():
                if name in (s.snapshot_id, *s.names):
                    return s.local, s.snapshot_id, s.names[0] if s.names else None
        return None
