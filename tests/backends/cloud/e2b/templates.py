"""Template builds of the E2B stand-in: what ``e2b.Template.build`` speaks (request a build, start it,
poll its status) and ``Template.exists`` (a name's lookup). PYTEST_DONT_REWRITE.

A build really pulls its image: the stand-in builds a local template FROM the image's reference on
its local backend (which must reach the registry), in a thread, and the template's name then starts
sandboxes of it. Only a bare ``fromImage`` template is built (no steps, no ``fromTemplate``); other
requests are refused with 400, as a feature the stand-in lacks. What each build asked (name, size,
image, registry user) is kept in :attr:`TemplateBuilds.builds`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pool import LocalBackend, Snapshot, Template
from tests.backends.cloud.e2b.wire import api_error, new_id
from tests.backends.cloud.http_standin import Reply, Request, json_reply


@dataclass(frozen=True)
class BuildRecord:
    """One template build as asked and as it went."""

    template_id: str
    build_id: str
    name: str
    cpu_count: int | None
    memory_mb: int | None
    min_free_disk_mb: int | None
    image: str | None = None
    registry_user: str | None = None
    status: str = "waiting"
    """``waiting``, ``building``, ``ready`` or ``error``."""
    reason: str | None = None
    logs: tuple[str, ...] = field(default_factory=tuple)


class TemplateBuilds:
    """E2B's template builds over a local backend; ``register(name, template_id, snapshot)`` makes a
    built template one the control plane creates sandboxes from."""

    def __init__(self, backend: LocalBackend, register: Callable[[str, str, Snapshot], None],
                 lock: threading.RLock) -> None:  # fmt: skip
        self.backend = backend
        self._register = register
        self._lock = lock
        self._builds: dict[str, BuildRecord] = {}
        self._names: dict[str, str] = {}
        """Built name -> template id."""
        self.routes: list[tuple[str, str, Callable[..., Reply]]] = [
            ("POST", r"/v3/templates", self._request),
            ("POST", r"/v2/templates/([^/]+)/builds/([^/]+)", self._start),
            ("GET", r"/templates/([^/]+)/builds/([^/]+)/status", self._status),
            ("GET", r"/templates/aliases/([^/]+)", self._alias),
        ]

    @property
    def builds(self) -> list[BuildRecord]:
        with self._lock:
            return list(self._builds.values())

    def _request(self, request: Request) -> Reply:
        body = request.json_object()
        name = str(body.get("name") or "")
        if not name:
            return api_error(400, "name is required")
        with self._lock:
            template_id = self._names.get(name) or new_id()
            record = BuildRecord(template_id, new_id(), name, body.get("cpuCount"), body.get("memoryMB"),
                                 body.get("minFreeDiskMb"))  # fmt: skip
            self._builds[record.build_id] = record
        reply = {"templateID": template_id, "buildID": record.build_id, "public": False, "names": [name],
                 "tags": [], "aliases": [name]}  # fmt: skip
        return json_reply(202, reply)

    def _start(self, request: Request, template_id: str, build_id: str) -> Reply:
        body = request.json_object()
        with self._lock:
            record = self._builds.get(build_id)
        if record is None or record.template_id != template_id:
            return api_error(404, f"build {build_id} of template {template_id} not found")
        if body.get("steps") or body.get("fromTemplate") or not body.get("fromImage"):
            return api_error(400, "the stand-in builds only a template FROM an image, without steps")
        registry = body.get("fromImageRegistry") or {}
        record = replace(record, image=str(body["fromImage"]), registry_user=registry.get("username"),
                         status="building")  # fmt: skip
        with self._lock:
            self._builds[build_id] = record
        threading.Thread(target=self._build, args=(record,), daemon=True, name="e2b-standin-build").start()
        return Reply(202)

    def _build(self, record: BuildRecord) -> None:
        assert record.image is not None
        try:
            snapshot = self.backend.build(Template(name=f"e2b-{record.name}", base=record.image))
        except Exception as exc:  # the build's failure is the template's status
            done = replace(record, status="error", reason=f"failed to pull the image {record.image}: {exc}")
        else:
            self._register(record.name, record.template_id, snapshot)
            with self._lock:
                self._names[record.name] = record.template_id
            done = replace(record, status="ready", logs=(f"pulled {record.image}",))
        with self._lock:
            self._builds[record.build_id] = done

    def _status(self, request: Request, template_id: str, build_id: str) -> Reply:
        with self._lock:
            record = self._builds.get(build_id)
        if record is None or record.template_id != template_id:
            return api_error(404, f"build {build_id} of template {template_id} not found")
        offset = int(request.arg("logsOffset") or 0)
        now = datetime.now(UTC).isoformat()
        entries = [{"timestamp": now, "level": "info", "message": line} for line in record.logs[offset:]]
        reply: dict[str, Any] = {"buildID": build_id, "templateID": template_id, "status": record.status,
                                 "logs": list(record.logs[offset:]), "logEntries": entries}  # fmt: skip
        if record.reason:
            reply["reason"] = {"message": record.reason}
        return json_reply(200, reply)

    def _alias(self, request: Request, alias: str) -> Reply:
        with self._lock:
            template_id = self._names.get(alias)
        if template_id is None:
            return api_error(404, f"template '{alias}' not found")
        return json_reply(200, {"templateID": template_id, "public": False})
