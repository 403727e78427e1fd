"""Sandboxes as the Daytona stand-in (tests/backends/cloud/daytona/standin.py) keeps them: their states, their
lifetimes in (scaled) minutes, and the JSON the API answers with. PYTEST_DONT_REWRITE.

A sandbox is ``started`` (a live local sandbox), ``stopped`` or ``archived`` (its files kept as a
local snapshot, its processes gone) or ``destroyed``; one created from an image is ``pending_build``
then ``building_snapshot`` while its image builds, and ``build_failed`` (with an ``errorReason``) if
the build fails. Daytona's lifetime rules, in minutes of
``minute_s`` seconds: idle ``auto_stop_interval`` minutes (0: never) since the last activity
stops it; ``auto_delete_interval`` minutes stopped (negative: never, 0: at once, ``ephemeral``)
destroys it; ``auto_archive_interval`` minutes stopped archives it; ``ttl_minutes`` (0: none)
after creation destroys it whatever its state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pool import Snapshot
from pool.backends.local import LocalSandbox
from tests.backends.cloud.daytona.toolbox import Toolbox
from tests.backends.cloud.daytona.wire import iso

ORGANIZATION_ID = "0a9f3f1e-5d2c-4c43-9c39-5e0d5b7d1c11"
"""The one organization every sandbox and snapshot belongs to."""
DAEMON_VERSION = "0.226.1-standin"
_DESIRED = {"started": "started", "stopped": "stopped", "archived": "archived", "destroyed": "destroyed"}
_DESIRED.update(pending_build="started", building_snapshot="started", build_failed="started")
DEFAULT_RESOURCES = {"cpu": 1, "gpu": 0, "memory": 1, "disk": 3}
"""What a sandbox gets when nothing asks otherwise (the API's defaults: cores, GPUs, GiB, GiB)."""


@dataclass(frozen=True, slots=True)
class SandboxRecord:
    """A Daytona sandbox as the stand-in knows it, destroyed or not."""

    sandbox_id: str
    name: str
    snapshot: str
    labels: dict[str, str]
    """As the API keeps them: the SDK's ``code-toolbox-language`` included."""
    env: dict[str, str]
    state: str
    """``started``, ``stopped``, ``archived`` or ``destroyed``; ``pending_build``, ``building_snapshot`` or
    ``build_failed`` for one created from an image."""
    request: dict[str, Any]
    """The create (or fork) body as sent, camelCase."""
    network: dict[str, Any]
    """``networkBlockAll``, ``networkAllowList``, ``domainAllowList``, ``outboundProxyUrl`` as sent."""
    auto_stop_interval: int
    auto_archive_interval: int
    auto_delete_interval: int
    ttl_minutes: int
    created_at: float
    stop_at: float | None
    """Unix time the reaper stops it unless something happens in it first (None: never)."""
    delete_at: float | None
    """Unix time the reaper destroys it at the latest if nothing happens in it (None: never)."""
    ended_by: str | None = None
    """What destroyed it: ``api`` (delete), ``stop`` (an ephemeral one stopped), ``ttl``, ``auto-delete``
    (the reaper; an ephemeral one auto-stopped too) or ``close`` (the stand-in closed)."""
    forked_from: str | None = None
    resources: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_RESOURCES))
    """``cpu``, ``gpu``, ``memory`` and ``disk`` as the API reports them (recorded, not enforced)."""
    error_reason: str | None = None
    build_ref: str | None = None
    """The image build it started from (``daytona-<sha256>:daytona``), if created from an image."""


@dataclass(slots=True)
class Box:
    """A sandbox's mutable state, guarded by the stand-in's lock."""

    id: str
    name: str
    snapshot: str
    request: dict[str, Any]
    labels: dict[str, str]
    env: dict[str, str]
    user: str
    target: str
    sandbox_class: str
    toolbox_url: str
    auto_stop: int = 15
    auto_archive: int = 7 * 24 * 60
    auto_delete: int = -1
    ttl_minutes: int = 0
    created_at: float = 0.0
    ttl_since: float = 0.0
    """Where ``ttl_minutes`` counts from: the create, or the last ``set_ttl``."""
    updated_at: float = 0.0
    last_activity: float = 0.0
    stopped_at: float | None = None
    state: str = "started"
    shown: str | None = None
    """A transitional state (``creating``, ``stopping``, ...) reported until ``polls_left`` GETs have seen it."""
    polls_left: int = 0
    local: LocalSandbox | None = None
    kept: Snapshot | None = None
    """The files of a stopped or archived sandbox."""
    toolbox: Toolbox | None = None
    forked_from: str | None = None
    ended_by: str | None = None
    network: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_RESOURCES))
    error_reason: str | None = None
    build: dict[str, Any] | None = None
    """The API's ``BuildInfo`` of a sandbox created from an image."""
    connected: str = "offline"
    """The network its local sandbox has: ``offline`` (as made) or ``public``."""

    @property
    def is_ephemeral(self) -> bool:
        return self.auto_delete == 0

    def show(self, transitional: str, polls: int, now: float) -> None:
        """Report ``transitional`` in the reply at hand and in the next ``polls`` GETs."""
        self.shown, self.polls_left, self.updated_at = transitional, polls, now

    def visible_state(self, *, poll: bool) -> str:
        if self.shown is not None and poll:
            if self.polls_left <= 0:
                self.shown = None
            self.polls_left -= 1
        return self.shown if self.shown is not None else self.state

    def deadlines(self, minute_s: float) -> tuple[float | None, float | None, float | None, float | None]:
        """When the reaper stops, archives or destroys it (by TTL, by auto-delete) if nothing happens."""
        ttl_at = self.ttl_since + self.ttl_minutes * minute_s if self.ttl_minutes > 0 else None
        stop_at = None
        if self.state == "started" and self.auto_stop > 0:
            stop_at = self.last_activity + self.auto_stop * minute_s
        idle_since = stop_at if self.state == "started" else self.stopped_at
        delete_at = (
            idle_since + self.auto_delete * minute_s if idle_since is not None and self.auto_delete >= 0 else None
        )
        archive_at = None
        if self.state == "stopped" and self.stopped_at is not None and self.auto_archive > 0:
            archive_at = self.stopped_at + self.auto_archive * minute_s
        return stop_at, archive_at, ttl_at, delete_at

    def due(self, now: float, minute_s: float) -> str | None:
        """What the reaper must do now: ``ttl``, ``auto-delete``, ``stop``, ``archive`` or nothing."""
        if self.state == "destroyed":
            return None
        stop_at, archive_at, ttl_at, delete_at = self.deadlines(minute_s)
        for action, at in (("ttl", ttl_at), ("auto-delete", delete_at), ("stop", stop_at), ("archive", archive_at)):
            if at is not None and at <= now:
                return action
        return None

    def record(self, minute_s: float) -> SandboxRecord:
        stop_at, _, ttl_at, delete_at = self.deadlines(minute_s)
        ends = [t for t in (ttl_at, delete_at) if t is not None]
        return SandboxRecord(
            sandbox_id=self.id,
            name=self.name,
            snapshot=self.snapshot,
            labels=dict(self.labels),
            env=dict(self.env),
            state=self.state,
            request=dict(self.request),
            network=dict(self.network),
            auto_stop_interval=self.auto_stop,
            auto_archive_interval=self.auto_archive,
            auto_delete_interval=self.auto_delete,
            ttl_minutes=self.ttl_minutes,
            created_at=self.created_at,
            stop_at=stop_at,
            delete_at=min(ends) if ends and self.state != "destroyed" else None,
            ended_by=self.ended_by,
            forked_from=self.forked_from,
            resources=dict(self.resources),
            error_reason=self.error_reason,
            build_ref=self.build["snapshotRef"] if self.build else None,
        )

    def json(self, minute_s: float, *, full: bool, poll: bool = False) -> dict[str, Any]:
        """The API's ``Sandbox`` (``full``) or ``SandboxListItem``."""
        ttl_at = self.deadlines(minute_s)[2]
        data: dict[str, Any] = {
            "id": self.id,
            "organizationId": ORGANIZATION_ID,
            "name": self.name,
            "snapshot": self.snapshot or None,
            "user": self.user,
            "labels": dict(self.labels),
            "public": bool(self.request.get("public")),
            "networkBlockAll": bool(self.network.get("networkBlockAll")),
            "networkAllowList": self.network.get("networkAllowList"),
            "domainAllowList": self.network.get("domainAllowList"),
            "target": self.target,
            **self.resources,
            "state": self.visible_state(poll=poll),
            "desiredState": _DESIRED[self.state],
            "errorReason": self.error_reason,
            "recoverable": False,
            "backupState": "None",
            "autoStopInterval": self.auto_stop,
            "autoArchiveInterval": self.auto_archive,
            "autoDeleteInterval": self.auto_delete,
            "autoDestroyAt": iso(ttl_at) if ttl_at is not None else None,
            "createdAt": iso(self.created_at),
            "updatedAt": iso(self.updated_at),
            "lastActivityAt": iso(self.last_activity),
            "sandboxClass": self.sandbox_class,
            "daemonVersion": DAEMON_VERSION,
            "runnerId": "standin-runner",
            "toolboxProxyUrl": self.toolbox_url,
        }
        if full:
            data.update(
                env=dict(self.env), kvm=False, outboundProxyUrl=self.network.get("outboundProxyUrl"), volumes=[]
            )
            if self.build is not None:
                data["buildInfo"] = dict(self.build)
        return data
