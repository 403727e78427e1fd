"""The embedded local backend: Linux namespaces over overlayfs layers.

See ``sandboxd/sandboxd.h`` for the process model. The backend is a factory and a catalogue: it settles
its options into a frozen ``LocalSettings``, sets up the ``Runtime`` its sandboxes share (the
daemon, the store), builds templates (``building``), creates and forks sandboxes, keeps ready
ones (``ready``), and lists snapshots. Each ``LocalSandbox`` runs its own lifecycle (snapshot,
restore, verification, close) through that runtime; see ``sandbox``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pool.backends.local import cgroups, kernel
from pool.backends.local.building import Builder
from pool.backends.local.daemon.client import DaemonClient, Op
from pool.backends.local.ready import ReadySandboxes, Started
from pool.backends.local.runtime import Runtime
from pool.backends.local.sandbox import LocalSandbox
from pool.backends.local.settings import MIB, LocalSettings
from pool.backends.local.store import layers
from pool.backends.local.store.catalogue import SnapshotStore, default_runtime_dir, default_store_dir
from pool.build import hostview
from pool.build.registry.settings import RegistrySettings, registry_settings
from pool.capabilities import Capabilities
from pool.egress.onhost.service import EgressService
from pool.egress.settings import EgressSettings
from pool.errors import (
    ConfigError,
    SandboxClosedError,
    SandboxCrashedError,
    SnapgymError,
    SnapshotCorruptError,
)
from pool.labels import OWNER, check_labels, new_owner
from pool.resources import DEFAULT_TIMEOUT_S
from pool.snapshots import Snapshot
from pool.templates import Template


def _setting(name: str) -> Any:
    """A read-only attribute of the backend that is the field ``name`` of its ``settings``."""
    return property(lambda backend: getattr(backend.settings, name), doc=f"See LocalBackend({name}=...).")


class LocalBackend:
    """Sandboxes on this Linux machine, restored from snapshots in milliseconds.

    Args:
        store_dir: where snapshots and layers live (default ~/.cache/snapgym,
            or $SNAPGYM_STORE).
        runtime_dir: where running sandboxes keep their mount points.
        memory_limit_mb: memory per sandbox (cgroup; per-process rlimit fallback).
        cpus: CPU share per sandbox, e.g. 1.5 (cgroup only); None: unlimited.
        pids_limit: processes per sandbox.
        disk_limit_mb: size of each sandbox's writable layer.
        max_snapshot_mb: the most one snapshot may add to the store, counted
            in allocated MiB (holes of sparse files are free); default:
            ``disk_limit_mb``.
        max_output_bytes: default cap on each of stdout and stderr.
        default_timeout_s: default exec timeout; None: no timeout.
        rootless: run without host root (default: when not root).
        id_offset: host uid that sandbox root maps to in root mode.
        prewarm: keep the next episode's namespaces set up beside each sandbox,
            so restore is a hand-off (one idle init process per sandbox), and
            network namespaces made ahead for new sandboxes and forks.
        ready_sandboxes: keep one sandbox started for the next create() of a
            snapshot created more than once (see pool.backends.local.ready).
        prefer_prebuilt: start a Dockerfile template from its prebuilt image
            (task.toml ``docker_image``) when that image can be had.
        registry: how images are fetched (a RegistrySettings, or its fields as a
            mapping): credentials (``auth_file``, ``credentials``), ``mirrors``,
            ``insecure_registries``, ``ca_dirs``, ``platform``.
        egress: how sandboxes reach the network when a policy lets them (a
            ``pool.egress.EgressSettings``, or its fields as a mapping): ``hosts``,
            ``upstream_proxy``, ``extra_ca_files``, ``trusted_networks``. Needs root;
            a rootless backend gives sandboxes loopback only.
    """

    name = "local"

    # the options as given (settled): each has one home, the frozen ``settings``
    rootless: bool = _setting("rootless")
    id_offset: int = _setting("id_offset")
    memory_limit_mb: int | None = _setting("memory_limit_mb")
    cpus: float | None = _setting("cpus")
    pids_limit: int | None = _setting("pids_limit")
    disk_limit_mb: int = _setting("disk_limit_mb")
    max_snapshot_mb: int = _setting("max_snapshot_mb")
    max_output_bytes: int = _setting("max_output_bytes")
    default_timeout_s: float | None = _setting("default_timeout_s")
    prewarm: bool = _setting("prewarm")

    def __init__(
        self,
        *,
        store_dir: str | os.PathLike[str] | None = None,
        runtime_dir: str | os.PathLike[str] | None = None,
        memory_limit_mb: int | None = 2048,
        cpus: float | None = None,
        pids_limit: int | None = 1024,
        disk_limit_mb: int = 1024,
        max_snapshot_mb: int | None = None,
        max_output_bytes: int = MIB,
        default_timeout_s: float | None = DEFAULT_TIMEOUT_S,
        rootless: bool | None = None,
        id_offset: int = 100000,
        prewarm: bool = True,
        ready_sandboxes: bool = True,
        prefer_prebuilt: bool = True,
        registry: RegistrySettings | Mapping[str, Any] | None = None,
        egress: EgressSettings | Mapping[str, Any] | None = None,
    ) -> None:
        kernel.require_linux()
        rootless = os.geteuid() != 0 if rootless is None else rootless
        if not rootless and os.geteuid() != 0:
            raise ConfigError("rootless=False needs host root; run as root or leave rootless unset")
        id_offset = 0 if rootless else id_offset
        self.tag = f"{os.getpid()}-{secrets.token_hex(4)}"
        """This instance's name: its runtime folder and cgroups carry it, and reap_orphans reads its pid."""
        self.settings = LocalSettings(
            tag=self.tag,
            rootless=rootless,
            id_offset=id_offset,
            memory_limit_mb=memory_limit_mb,
            cpus=cpus,
            pids_limit=pids_limit,
            disk_limit_mb=disk_limit_mb,
            max_snapshot_mb=disk_limit_mb if max_snapshot_mb is None else max_snapshot_mb,
            max_output_bytes=max_output_bytes,
            default_timeout_s=default_timeout_s,
            prewarm=prewarm,
            cgroup_controllers=frozenset(cgroups.available() if not rootless else ()),
            host=hostview.discover(),
        )
        """What every sandbox of this backend runs under (it refuses options out of range)."""
        self.prefer_prebuilt = prefer_prebuilt
        self.registry = registry_settings(registry)
        self.egress = EgressService(
            egress,
            available=not rootless,
            unavailable_reason="a rootless local backend cannot reach into "
            "its sandboxes' network namespaces; run as root for network policies other than no-network",
        )
        self.store = SnapshotStore(
            Path(store_dir) if store_dir else default_store_dir(), id_offset=id_offset, rootless=rootless
        )
        self.store.reap()  # staging folders of processes killed mid-snapshot
        self._runtime_root = Path(runtime_dir) if runtime_dir else default_runtime_dir()
        self.runtime = Runtime(self.settings, self.store, self._runtime_root, self.egress)
        """The daemon and store this backend's sandboxes share."""
        self._builder = Builder(
            self.store,
            settings=self.settings,
            registry=self.registry,
            prefer_prebuilt=prefer_prebuilt,
            egress=self.egress,
        )
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._sandboxes: dict[int, LocalSandbox] = {}
        self._ready = ReadySandboxes(ready_sandboxes)
        self._closed = False
        self._owner = new_owner()
        self.reap_orphans()

    # -- public API -----------------------------------------------------------

    @classmethod
    def resolve_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options with ``store_dir`` settled in this process ($SNAPGYM_STORE, else the user's cache).

        A pool's host actors run with the environment of their Ray node, so a default
        resolved there could build into a store the driver never configured.
        """
        resolved = dict(options)
        if not resolved.get("store_dir"):
            resolved["store_dir"] = str(default_store_dir())
        return resolved

    @classmethod
    def unavailable_reason(cls, **options: Any) -> str | None:
        """None on Linux (whether namespaces work shows when the first sandbox starts, with the fix)."""
        try:
            kernel.require_linux()
        except SnapgymError as exc:
            return str(exc)
        return None

    @property
    def health(self) -> str | None:
        """None while the sandbox daemon runs (or has not started); otherwise why not."""
        if self._closed:
            return "the backend is closed"
        daemon = self.runtime.started_daemon
        if daemon is not None and not daemon.is_alive:
            return f"the sandbox daemon died ({daemon.log_tail() or 'no message'})"
        return None

    @property
    def capabilities(self) -> Capabilities:
        """What this backend enforces on this machine (see :mod:`.kernel`)."""
        controllers, fields = self.settings.cgroup_controllers, self.egress.capability_fields
        return kernel.capabilities(controllers, fields, rootless=self.rootless, landlock_abi=kernel.landlock_abi())

    @classmethod
    def capability_range(cls) -> dict[str, Capabilities]:
        """What the backend declares on a kernel that gives it everything, then without each part (see
        :mod:`.kernel`), stated without starting it."""
        return kernel.capability_range()

    def build(self, template: Template) -> Snapshot:
        """Build (or find in the store) the snapshot of a template.

        A stored snapshot and the base are checked against their digests before
        use (once per process); one whose layer was deleted is built again.

        Raises:
            BuildError: a setup step or the healthcheck failed; the message
                holds the step and its output.
            SnapshotCorruptError: a stored layer or record differs from its
                digest; the message names the layer, the path and what to delete.
            SnapshotTooLargeError: the setup left more than ``max_snapshot_mb``.
            StoreFullError: the store's filesystem is full.
        """
        self._check_open()
        return self._builder.build(template, lambda snapshot, network: self._open(snapshot, network=network))

    def create(self, snapshot: Snapshot, *, labels: Mapping[str, str] | None = None) -> LocalSandbox:
        """Start a sandbox at ``snapshot``, carrying ``labels``.

        From a snapshot's second create() on, one more sandbox of it is kept started for the
        next call (``ready_sandboxes``; see pool.backends.local.ready).
        """
        self._check_open()
        self.runtime.check_snapshot(snapshot)
        given = {**check_labels(labels), OWNER: self._owner}
        sandbox = self._take_ready(snapshot, given)
        if sandbox is None:
            sandbox = self._open(snapshot, network=False, labels=labels)
        if self._ready.wants_one(snapshot.id):
            self._start_ready(snapshot)
        return sandbox

    def fork(self, snapshot: Snapshot, n: int, *, labels: Mapping[str, str] | None = None) -> list[LocalSandbox]:
        """Start ``n`` sandboxes that each begin at ``snapshot`` (set up in parallel).

        The children start without a spare (a branch usually runs once and closes); a child's
        first restore builds its spare.
        """
        if n < 1:
            raise ConfigError(f"fork needs n >= 1, got {n}")
        self._check_open()
        self.runtime.check_snapshot(snapshot)
        return self._open_many(snapshot, n, network=False, labels=labels, spare=False)

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        """A stored snapshot by id."""
        return self.store.get(snapshot_id)

    def snapshots(self) -> list[Snapshot]:
        """Every snapshot in the store."""
        return self.store.all()

    def verify(self, snapshot: Snapshot) -> bool:
        """Rehash every byte of a snapshot's layers and check them and its digest.

        Slower than the check before first use (which trusts unchanged stat data),
        and it also catches damage below the filesystem.

        Returns:
            False when a layer or the record differs from the digest.

        Raises:
            SnapshotError: a layer is missing or the snapshot is another backend's.
        """
        try:
            self.runtime.check_snapshot(snapshot, deep=True)
        except SnapshotCorruptError:
            return False
        return True

    def __deepcopy__(self, memo: dict[int, object]) -> LocalBackend:
        """A backend is a shared resource (a daemon, a store): copies are the same backend.

        Gymnasium deep-copies ``gym.make`` keyword arguments into the env spec.
        """
        return self

    def __copy__(self) -> LocalBackend:
        return self

    @property
    def is_closed(self) -> bool:
        """True after close()."""
        return self._closed

    def close(self) -> None:
        """Close every sandbox and stop the daemon. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._discard_started(self._ready.drain())
        with self._lock:
            sandboxes = list(self._sandboxes.values())
        for sandbox in sandboxes:
            with contextlib.suppress(SandboxCrashedError):
                sandbox.close()
        self.egress.close()
        self.runtime.close()

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reap_orphans(self) -> int:
        """Remove what crashed earlier runs left behind; returns how many runs."""
        root = self._runtime_root
        if not root.is_dir():
            return 0

        def alive(tag: str) -> bool:
            pid = tag.split("-", 1)[0]
            return pid.isdigit() and _pid_alive(int(pid))

        reaped = 0
        for run in root.iterdir():
            if run.is_dir() and not alive(run.name):
                layers.remove_tree(run)
                reaped += 1
        for group in cgroups.stale_groups(lambda name: alive(name)):
            cgroups.kill_and_remove(group)
        return reaped

    # -- the daemon, for tests and health checks -------------------------------

    @property
    def daemon_has_died(self) -> bool:
        """True when the daemon was started and is gone (its sandboxes with it)."""
        return self.runtime.daemon_has_died

    @property
    def _daemon(self) -> DaemonClient | None:
        return self.runtime.started_daemon

    def daemon_request(self, op: Op, sandbox_id: int, fields: list[tuple[str, str]]) -> dict[str, str]:
        """A control request to the daemon (see daemon.DaemonClient.request)."""
        return self.runtime.request(op, sandbox_id, fields)

    def stage_dir(self, sandbox: LocalSandbox) -> Path:
        """The sandbox's writable tmpfs (its instance's stage), seen through its keeper's mount namespace."""
        return sandbox.stage_dir

    # -- internals ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError("the backend is closed; create a new LocalBackend")

    def _open(self, snapshot: Snapshot, *, network: bool, labels: Mapping[str, str] | None = None) -> LocalSandbox:
        return self._open_many(snapshot, 1, network=network, labels=labels)[0]

    def _open_many(
        self, snapshot: Snapshot, n: int, *, network: bool, labels: Mapping[str, str] | None = None, spare: bool = True
    ) -> list[LocalSandbox]:
        given = {**check_labels(labels), OWNER: self._owner}
        started: list[Started] = []
        error: BaseException | None = None
        for _ in range(n):
            try:
                started.append(self._submit_create(snapshot, network=network, labels=given, spare=spare))
            except BaseException as exc:
                error = exc
                break
        return self._collect_created(started, error)

    def _submit_create(
        self, snapshot: Snapshot, *, network: bool, labels: Mapping[str, str], spare: bool = True
    ) -> Started:
        """Ask the daemon for a new sandbox at ``snapshot``; the reply is not waited for. ``spare``
        False: no spare until its first restore (which then builds one)."""
        self.runtime.daemon()  # started before the sandbox's cgroup is made
        sandbox = LocalSandbox(self.runtime, next(self._ids), snapshot, labels, forget=self._forget)
        return sandbox, sandbox.start(network=network, spare=spare)

    def _forget(self, number: int) -> None:
        """Drop a closed sandbox from the catalogue."""
        with self._lock:
            self._sandboxes.pop(number, None)

    def _take_ready(self, snapshot: Snapshot, labels: Mapping[str, str]) -> LocalSandbox | None:
        """The snapshot's ready sandbox, now carrying ``labels``; None when there is none or it failed
        to start (the caller then creates one the usual way, which reports the reason)."""
        started = self._ready.take(snapshot.id)
        if started is None:
            return None
        try:
            (sandbox,) = self._collect_created([started], None)
        except SnapgymError:
            return None
        sandbox.relabel(labels)
        return sandbox

    def _start_ready(self, snapshot: Snapshot) -> None:
        """Start the next create()'s sandbox of ``snapshot`` in the background (best effort)."""
        try:
            # without its spare: half the set-up beside the caller's first commands; its first
            # restore builds the spare (the keeper sees the config change)
            started = self._submit_create(snapshot, network=False, labels={OWNER: self._owner}, spare=False)
        except SnapgymError:
            return
        replaced = self._ready.put(snapshot.id, started)
        if replaced is not None:
            self._discard_started([replaced])

    def _discard_started(self, started: list[Started]) -> None:
        """Close sandboxes that were started for no one (ready ones at close)."""
        with contextlib.suppress(SnapgymError):
            for sandbox in self._collect_created(started, None):
                with contextlib.suppress(SnapgymError):
                    sandbox.close()

    def _collect_created(self, started: list[Started], error: BaseException | None) -> list[LocalSandbox]:
        """Wait for the replies of ``started``; every sandbox, or (closing those made) the first error."""
        made: list[LocalSandbox] = []
        for sandbox, pending in started:
            try:
                sandbox.finish_start(pending)
            except BaseException as exc:
                error = error or exc
                continue
            with self._lock:
                self._sandboxes[sandbox.number] = sandbox
            made.append(sandbox)
        if error is not None:
            for sandbox in made:
                sandbox.close()
            raise error
        return made


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
