"""The control plane of the Daytona stand-in (tests/backends/cloud/daytona/standin.py): the ``/sandbox`` and
``/snapshots`` resources, creates from images (their builds: builds.py), the lifetimes the reaper
enforces, and the way to each sandbox's toolbox.
Authentication, faults and the request log are the stand-in's. PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from pool import LocalBackend
from pool.backends.local import LocalSandbox
from pool.egress import NetworkPolicy, Phase
from tests.backends.cloud.daytona.builds import Build, Builds
from tests.backends.cloud.daytona.lifecycle import DEFAULT_RESOURCES, Box, SandboxRecord
from tests.backends.cloud.daytona.snapshots import SnapshotRegistry
from tests.backends.cloud.daytona.toolbox import CommandRecord, Toolbox
from tests.backends.cloud.daytona.wire import api_error, iso
from tests.backends.cloud.http_standin import Reply, Request, json_reply

DEFAULT_SNAPSHOT = "daytona-small"
"""The snapshot a create without ``snapshot`` gets (the API's configured default)."""
HOME = "/home/daytona"
"""The sandbox user's home (``get_user_home_dir``)."""
_NETWORK_KEYS = ("networkBlockAll", "networkAllowList", "domainAllowList", "outboundProxyUrl")
_RESOURCE_KEYS = ("cpu", "gpu", "memory", "disk")
_BUILDING = ("pending_build", "building_snapshot")
_FORKED = ("auto_stop", "auto_archive", "auto_delete", "labels", "env", "user", "target", "network", "resources")
"""What a fork takes from its source."""
_UNSAFE_NAME = re.compile(
    r"<[a-zA-Z/][^>]*>?|https?://|ftps?://|wss?://|file://|www\.|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"
)


class ControlPlane:
    """Daytona's sandboxes and snapshots over a local backend; the settings are the stand-in's."""

    def __init__(
        self,
        backend: LocalBackend,
        *,
        toolbox_url: str,
        record_command: Callable[[CommandRecord], None],
        minute_s: float,
        settle_polls: int,
        sandbox_class: str,
        max_creates_per_s: float | None,
        rate_limit_retry_after_s: int | None,
        session_timeout_s: float | None,
    ) -> None:
        self.backend = backend
        self.toolbox_url = toolbox_url
        self.minute_s = minute_s
        self.settle_polls = settle_polls
        self.sandbox_class = sandbox_class
        self.max_creates_per_s = max_creates_per_s
        self.rate_limit_retry_after_s = rate_limit_retry_after_s
        self.session_timeout_s = session_timeout_s
        self._record_command = record_command
        self._lock = threading.RLock()
        self._create_lock = threading.Lock()
        self._boxes: dict[str, Box] = {}
        self.snapshots = SnapshotRegistry()
        self.builds = Builds(backend)
        self.api_url = toolbox_url.removesuffix("/toolbox")
        self._create_times: list[float] = []
        self.created_count = 0
        s, n = r"([^/]+)", r"(-?\d+)"
        box = self._with_box
        self.routes: list[tuple[str, re.Pattern[str], Callable[..., Reply]]] = [
            ("POST", re.compile(r"/sandbox"), self._create),
            ("GET", re.compile(r"/sandbox"), self._list),
            ("GET", re.compile(f"/sandbox/{s}"), lambda r, x: box(r, x, self._get)),
            ("DELETE", re.compile(f"/sandbox/{s}"), lambda r, x: box(r, x, self._delete)),
            ("POST", re.compile(f"/sandbox/{s}/start"), lambda r, x: box(r, x, self._start)),
            ("POST", re.compile(f"/sandbox/{s}/stop"), lambda r, x: box(r, x, self._stop)),
            ("POST", re.compile(f"/sandbox/{s}/archive"), lambda r, x: box(r, x, self._archive)),
            ("POST", re.compile(f"/sandbox/{s}/snapshot"), lambda r, x: box(r, x, self._snapshot)),
            ("POST", re.compile(f"/sandbox/{s}/fork"), lambda r, x: box(r, x, self._fork)),
            ("POST", re.compile(f"/sandbox/{s}/(autostop|autoarchive|autodelete|ttl)/{n}"), self._set_interval),
            ("POST", re.compile(f"/sandbox/{s}/last-activity"), lambda r, x: box(r, x, self._touch)),
            ("PUT", re.compile(f"/sandbox/{s}/labels"), lambda r, x: box(r, x, self._labels)),
            ("POST", re.compile(f"/sandbox/{s}/network-settings"), lambda r, x: box(r, x, self._network_settings)),
            ("GET", re.compile(f"/sandbox/{s}/toolbox-proxy-url"), lambda r, x: json_reply(200, {"url": toolbox_url})),
            ("GET", re.compile(f"/sandbox/{s}/build-logs-url"), lambda r, x: box(r, x, self._build_logs_url)),
            ("GET", re.compile(f"/sandbox/{s}/build-logs"), lambda r, x: box(r, x, self._build_logs)),
            *self.snapshots.routes,
        ]

    def sandboxes(self) -> dict[str, SandboxRecord]:
        with self._lock:
            return {sid: box.record(self.minute_s) for sid, box in self._boxes.items()}

    def toolbox_call(self, request: Request, sandbox_id: str, path: str) -> Reply:
        """A call to a sandbox's daemon, which counts as activity (it puts off auto-stop)."""
        with self._lock:
            box = self._boxes.get(sandbox_id)
            if box is None or box.state == "destroyed":
                return api_error(request, 404, "not found: sandbox not found")
            toolbox = box.toolbox
            if toolbox is None:
                return api_error(request, 400, f"bad request: sandbox {sandbox_id} is {box.state}, not started")
            box.last_activity = time.time()
        return toolbox.handle(request, path)

    def reap(self) -> None:
        """Stop, archive and destroy the sandboxes past their time."""
        now = time.time()
        with self._lock:
            due = [(box, box.due(now, self.minute_s)) for box in self._boxes.values()]
        for box, action in due:
            with contextlib.suppress(Exception):  # one sandbox that fails to close must not stop the others
                if action in ("ttl", "auto-delete"):
                    self._destroy(box, action)
                elif action == "stop":
                    self._stop_box(box, ended_by="auto-delete")
                elif action == "archive":
                    with self._lock:
                        box.state = "archived"

    def destroy_all(self, ended_by: str) -> None:
        with self._lock:
            boxes = list(self._boxes.values())
        for box in boxes:
            self._destroy(box, ended_by)

    # -- sandboxes ---------------------------------------------------------------------------

    def _find(self, id_or_name: str) -> Box | None:
        with self._lock:
            live = [b for b in self._boxes.values() if b.state != "destroyed"]
            return next((b for b in live if b.id == id_or_name), None) or next(
                (b for b in live if b.name == id_or_name), None
            )

    def _with_box(self, request: Request, id_or_name: str, handler: Callable[[Request, Box], Reply]) -> Reply:
        box = self._find(id_or_name)
        if box is None:
            return api_error(request, 404, f"Sandbox with ID or name {id_or_name} not found")
        return handler(request, box)

    def _dto(self, box: Box, *, poll: bool = False) -> Reply:
        with self._lock:
            return json_reply(200, box.json(self.minute_s, full=True, poll=poll))

    def _admit(self, request: Request) -> Reply | None:
        """A 429 when one more create would pass ``max_creates_per_s``; else count it."""
        now = time.monotonic()
        with self._lock:
            self._create_times = [t for t in self._create_times if now - t < 1.0]
            if self.max_creates_per_s is not None and len(self._create_times) >= self.max_creates_per_s:
                retry = self.rate_limit_retry_after_s
                headers = {"Retry-After": str(retry)} if retry is not None else {}
                return api_error(request, 429, "ThrottlerException: Too Many Requests", headers)
            self._create_times.append(now)
        return None

    def _create(self, request: Request) -> Reply:
        body = request.json()
        with self._create_lock:
            if refused := self._admit(request):
                return refused
            if body.get("name") and self._find(body["name"]):
                return api_error(request, 409, f"Sandbox with name {body['name']} already exists")
            if body.get("buildInfo"):
                return self._create_from_image(request, body)
            wanted = body.get("snapshot") or DEFAULT_SNAPSHOT
            entry = self.snapshots.find(wanted)
            if entry is None:
                message = f"Snapshot {wanted} not found. Did you add it through the Daytona Dashboard?"
                return api_error(request, 400, message)
            settings = {**self._settings(body), "resources": dict(entry.resources)}  # the snapshot's, not the body's
            box = self._open(self.backend.create(entry.local), entry.name, body, settings, "unknown")
        self._connect(box)
        return self._dto(box)

    @staticmethod
    def _settings(body: dict[str, Any]) -> dict[str, Any]:
        return {
            "auto_stop": int(body.get("autoStopInterval", 15)),
            "auto_archive": int(body.get("autoArchiveInterval") or 7 * 24 * 60),
            "auto_delete": int(body.get("autoDeleteInterval", -1)),
            "ttl_minutes": int(body.get("ttlMinutes") or 0),
            "labels": dict(body.get("labels") or {}),
            "env": dict(body.get("env") or {}),
            "user": body.get("user") or "daytona",
            "target": body.get("target") or "us",
            "network": {k: body[k] for k in _NETWORK_KEYS if k in body},
        }

    def _create_from_image(self, request: Request, body: dict[str, Any]) -> Reply:
        """``buildInfo``: the sandbox waits in ``pending_build`` (a new build) or ``building_snapshot`` (one
        under way) and starts when the build is ready; a failed build leaves it ``build_failed``. Its
        resources are the body's, where given (Daytona's defaults otherwise)."""
        info = body["buildInfo"]
        dockerfile, hashes = info.get("dockerfileContent"), list(info.get("contextHashes") or [])
        if not isinstance(dockerfile, str) or not dockerfile.strip():
            return api_error(request, 400, "buildInfo.dockerfileContent should not be empty")
        resources = {k: int(body.get(k) or DEFAULT_RESOURCES[k]) for k in _RESOURCE_KEYS}
        box = self._open(None, "", body, {**self._settings(body), "resources": resources}, None)
        build, fresh = self.builds.request(dockerfile, hashes, lambda done: self._built(box.id, done))
        now = iso(time.time())
        with self._lock:
            box.build = {"snapshotRef": build.ref, "dockerfileContent": dockerfile, "contextHashes": hashes}
            box.build.update(createdAt=now, updatedAt=now)
            if box.state == "pending_build" and not fresh and not build.done.is_set():
                box.state = "building_snapshot"  # a build of the same image is under way
        return self._dto(box)

    def _built(self, box_id: str, build: Build) -> None:
        """Start the sandbox on its finished build, or fail it as Daytona fails a build."""
        with self._lock:
            box = self._boxes.get(box_id)
            if box is None or box.state not in _BUILDING:
                return  # deleted while it waited
            if build.local is None:
                box.state, box.error_reason = "build_failed", build.error_reason or "Failed to build snapshot"
                box.updated_at = time.time()
                return
        local: LocalSandbox | None = self.backend.create(build.local)
        with self._lock:
            if box.state in _BUILDING and local is not None:
                box.local, box.toolbox, box.state = local, self._toolbox(box, local), "started"
                box.last_activity = box.updated_at = time.time()
                local = None
        if local is not None:  # deleted meanwhile
            local.close()
        else:
            self._connect(box)

    def _build_logs_url(self, request: Request, box: Box) -> Reply:
        return json_reply(200, {"url": f"{self.api_url}/sandbox/{box.id}/build-logs"})

    def _build_logs(self, request: Request, box: Box) -> Reply:
        """The build's log as text; with ``follow=true``, streamed until the build ends."""
        build = self.builds.find(box.build["snapshotRef"]) if box.build else None
        if build is None:
            return api_error(request, 400, "Sandbox has no build info")
        follow = (request.arg("follow") or "").lower() == "true"
        return Reply(200, content_type="text/plain", stream=self.builds.log_lines(build, follow=follow))

    def _open(
        self,
        local: LocalSandbox | None,
        snapshot: str,
        body: dict[str, Any],
        settings: dict[str, Any],
        shown: str | None,
    ) -> Box:
        now = time.time()
        sandbox_id = str(uuid.uuid4())
        box = Box(
            id=sandbox_id,
            name=body.get("name") or sandbox_id,
            snapshot=snapshot,
            request=dict(body),
            sandbox_class=self.sandbox_class,
            toolbox_url=self.toolbox_url,
            created_at=now,
            ttl_since=now,
            last_activity=now,
            local=local,
            **settings,
        )
        if local is None:  # an image's build comes first
            box.state = "pending_build"
        else:
            box.toolbox = self._toolbox(box, local)
        if shown is not None:
            box.show(shown, self.settle_polls, now)
        with self._lock:
            self._boxes[sandbox_id] = box
            self.created_count += 1
        return box

    def _toolbox(self, box: Box, local: LocalSandbox) -> Toolbox:
        workdir = local.start_snapshot.workdir
        return Toolbox(
            box.id,
            local,
            env=box.env,
            workdir=workdir,
            home=HOME,
            session_timeout_s=self.session_timeout_s,
            record=self._record_command,
        )

    def _list(self, request: Request) -> Reply:
        labels = json.loads(request.arg("labels") or "{}")
        states = {s for value in request.query.get("states", []) for s in value.split(",")}
        snapshots = {s for value in request.query.get("snapshots", []) for s in value.split(",")}
        id_prefix, name_prefix = (request.arg("id") or "").lower(), (request.arg("name") or "").lower()
        limit = int(request.arg("limit") or 100)
        cursor = json.loads(base64.urlsafe_b64decode(request.arg("cursor") or "")) if request.arg("cursor") else None
        with self._lock:
            found = [
                b
                for b in self._boxes.values()
                if b.state != "destroyed"
                and labels.items() <= b.labels.items()
                and (not states or b.state in states)
                and (not snapshots or b.snapshot in snapshots)
                and b.id.lower().startswith(id_prefix)
                and b.name.lower().startswith(name_prefix)
                and (cursor is None or [b.created_at, b.id] < cursor)
            ]
            found.sort(key=lambda b: (b.created_at, b.id), reverse=True)
            page = found[:limit]
            items = [b.json(self.minute_s, full=False) for b in page]
        more = len(found) > limit
        token = (
            base64.urlsafe_b64encode(json.dumps([page[-1].created_at, page[-1].id]).encode()).decode() if more else None
        )
        return json_reply(200, {"items": items, "nextCursor": token})

    def _get(self, request: Request, box: Box) -> Reply:
        return self._dto(box, poll=True)

    def _delete(self, request: Request, box: Box) -> Reply:
        with self._lock:
            if any(b.forked_from == box.id and b.state != "destroyed" for b in self._boxes.values()):
                message = "Cannot delete sandbox which has active fork children. The forks must be deleted first."
                return api_error(request, 400, message)
        self._destroy(box, "api")
        box.show("destroying", 0, time.time())
        return self._dto(box)

    def _start(self, request: Request, box: Box) -> Reply:
        with self._lock:
            kept, box.kept = box.kept, None
        if kept is not None:
            local = self.backend.create(kept)
            with self._lock:
                box.local, box.toolbox, box.state = local, self._toolbox(box, local), "started"
                box.stopped_at, box.last_activity, box.connected = None, time.time(), "offline"
            box.show("starting", self.settle_polls, time.time())
            self._connect(box)
        return self._dto(box)

    def _stop(self, request: Request, box: Box) -> Reply:
        if box.state != "started":
            return api_error(request, 400, "Sandbox is not in a stoppable state")
        self._stop_box(box, ended_by="stop")
        box.show("stopping", self.settle_polls, time.time())
        return self._dto(box)

    def _archive(self, request: Request, box: Box) -> Reply:
        if box.state != "stopped":
            return api_error(request, 400, "Sandbox is not stopped")
        with self._lock:
            box.state = "archived"
        box.show("archiving", self.settle_polls, time.time())
        return self._dto(box)

    def _snapshot(self, request: Request, box: Box) -> Reply:
        name = request.json().get("name")
        if not isinstance(name, str) or not name or _UNSAFE_NAME.search(name):
            return api_error(request, 400, "name must not contain HTML tags, URLs, or control characters")
        if box.state not in ("started", "stopped"):
            return api_error(request, 400, "Sandbox must be in started or stopped state to create a snapshot")
        local = box.local.snapshot() if box.local is not None else box.kept
        if local is not None:  # a taken name: dropped without an error, as Daytona drops it
            self.snapshots.add(
                name, local, source_sandbox_id=box.id, sandbox_class=box.sandbox_class, resources=box.resources
            )
        box.show("snapshotting", self.settle_polls, time.time())
        return self._dto(box)

    def _fork(self, request: Request, source: Box) -> Reply:
        if source.sandbox_class not in ("linux-vm", "windows"):
            return api_error(request, 422, "Forking is not supported for this sandbox")
        if source.state != "started" or source.local is None:
            return api_error(request, 400, "Sandbox must be in started state to fork")
        body = request.json()
        with self._create_lock:
            if refused := self._admit(request):
                return refused
            if body.get("name") and self._find(body["name"]):
                return api_error(request, 409, f"Sandbox with name {body['name']} already exists")
            local = self.backend.create(source.local.snapshot())
            settings = {k: _copy(getattr(source, k)) for k in _FORKED}
            child = self._open(local, source.snapshot, body, settings, "creating")
            child.forked_from = source.id
        self._connect(child)
        source.show("forking", self.settle_polls, time.time())
        return self._dto(child)

    def _set_interval(self, request: Request, id_or_name: str, kind: str, value: str) -> Reply:
        box = self._find(id_or_name)
        if box is None:
            return api_error(request, 404, f"Sandbox with ID or name {id_or_name} not found")
        attribute = {"autostop": "auto_stop", "autoarchive": "auto_archive", "autodelete": "auto_delete"}
        with self._lock:
            if kind == "ttl":
                box.ttl_minutes, box.ttl_since = int(value), time.time()
            else:
                setattr(box, attribute[kind], int(value))
        return self._dto(box)

    def _touch(self, request: Request, box: Box) -> Reply:
        with self._lock:
            box.last_activity = time.time()
        return Reply(201)

    def _labels(self, request: Request, box: Box) -> Reply:
        with self._lock:
            box.labels = dict(request.json().get("labels") or {})
            return json_reply(200, {"labels": dict(box.labels)})

    def _network_settings(self, request: Request, box: Box) -> Reply:
        """``update_network_settings``: recorded as sent, as Daytona's runner would apply it (block all
        lifts an allow list; an allow list lifts block all)."""
        body = request.json()
        with self._lock:
            if body.get("networkBlockAll") is False:
                box.network = {k: v for k, v in box.network.items() if k not in ("networkAllowList", "domainAllowList")}
            if "networkAllowList" in body or "domainAllowList" in body:
                box.network["networkBlockAll"] = False
            box.network.update({k: body[k] for k in _NETWORK_KEYS if k in body})
            box.updated_at = box.last_activity = time.time()
        self._connect(box)
        return self._dto(box)

    def _connect(self, box: Box) -> None:
        """Give the local sandbox the network its settings say, where that is all or nothing: ``networkBlockAll``
        false without allow lists is the open network (through the local backend's egress proxy), true is
        none; allow lists are recorded, not enforced."""
        with self._lock:
            lists = box.network.get("networkAllowList") or box.network.get("domainAllowList")
            block = box.network.get("networkBlockAll")
            wanted = None if lists or block is None else ("offline" if block else "public")
            local = box.local
            if local is None or wanted is None or wanted == box.connected:
                return
            box.connected = wanted
        local.set_network(NetworkPolicy.public() if wanted == "public" else NetworkPolicy.offline(), phase=Phase.BUILD)

    # -- lifetimes ---------------------------------------------------------------------------

    def _stop_box(self, box: Box, *, ended_by: str) -> None:
        """Keep the files, end the processes; an ephemeral sandbox is destroyed instead."""
        with self._lock:
            local, box.local, box.toolbox = box.local, None, None
        if local is None:
            return
        kept = local.snapshot()
        local.close()
        with self._lock:
            if box.state == "started":
                box.kept, box.state, box.stopped_at = kept, "stopped", time.time()
        if box.is_ephemeral:
            self._destroy(box, ended_by)

    def _destroy(self, box: Box, ended_by: str) -> None:
        with self._lock:
            if box.state == "destroyed":
                return
            local, box.local, box.kept, box.toolbox = box.local, None, None, None
            box.state, box.ended_by, box.updated_at = "destroyed", ended_by, time.time()
        if local is not None:
            local.close()


def _copy(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else value
