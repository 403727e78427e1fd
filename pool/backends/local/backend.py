"""The embedded local backend: Linux namespaces over overlayfs layers.

See ``sandboxd.c`` for the process model. This module owns the host side:
the snapshot store, the daemon, per-sandbox cgroups, builds and snapshots.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import posixpath
import resource
import secrets
import shlex
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pool.backends.local import cgroups, kernel, layers, native, seal
from pool.backends.local.daemon import DaemonClient, Fields, Op
from pool.backends.local.imagebase import image_base
from pool.backends.local.layerview import Entry, LayerView
from pool.backends.local.mountpoints import mount_point_layer
from pool.backends.local.oci import ImageFetcher
from pool.backends.local.ocilayer import unpack_layer
from pool.backends.local.ocisettings import Credentials, RegistrySettings
from pool.backends.local.ready import ReadySandboxes, Started
from pool.backends.local.sandbox import LocalSandbox
from pool.backends.local.store import BaseRecord, SnapshotStore, default_runtime_dir, default_store_dir
from pool.build import hostview
from pool.build.digest import combine, source_key
from pool.build.dockerfile import ImageCopy
from pool.build.images import BaseConfig, Recipe, file_target, recipe_for, run_recipe
from pool.build.network import BuildRoute, build_route
from pool.capabilities import Capabilities, Enforcement
from pool.contract import Sandbox
from pool.egress.service import EgressService
from pool.egress.settings import EgressSettings
from pool.errors import (
    BackendError,
    BuildError,
    ConfigError,
    ImageError,
    SandboxClosedError,
    SandboxCrashedError,
    SandboxOutOfMemoryError,
    SnapgymError,
    SnapshotCorruptError,
    SnapshotError,
    SnapshotTooLargeError,
)
from pool.labels import OWNER, check_labels, new_owner
from pool.resources import Resources, require_supported
from pool.snapshots import BASE_ENV, Snapshot
from pool.templates import HOST_BASE, Template
from pool.verification import VerificationPlan, VerificationReport, VerifyMode

_ID_RANGE = 65536
_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class _Base:
    layers: tuple[str, ...]
    digest: str
    config: BaseConfig = field(default_factory=BaseConfig)


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
            so restore is a hand-off (one idle init process per sandbox).
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
        max_output_bytes: int = _MIB,
        default_timeout_s: float | None = 600.0,
        rootless: bool | None = None,
        id_offset: int = 100000,
        prewarm: bool = True,
        ready_sandboxes: bool = True,
        prefer_prebuilt: bool = True,
        registry: RegistrySettings | Mapping[str, Any] | None = None,
        egress: EgressSettings | Mapping[str, Any] | None = None,
    ) -> None:
        kernel.require_linux()
        _check_positive(
            memory_limit_mb=memory_limit_mb,
            cpus=cpus,
            pids_limit=pids_limit,
            disk_limit_mb=disk_limit_mb,
            max_snapshot_mb=max_snapshot_mb,
            max_output_bytes=max_output_bytes,
            default_timeout_s=default_timeout_s,
        )
        self.rootless = os.geteuid() != 0 if rootless is None else rootless
        if not self.rootless and os.geteuid() != 0:
            raise ConfigError("rootless=False needs host root; run as root or leave rootless unset")
        self.id_offset = 0 if self.rootless else id_offset
        self.memory_limit_mb = memory_limit_mb
        self.cpus = cpus
        self.pids_limit = pids_limit
        self.disk_limit_mb = disk_limit_mb
        self.max_snapshot_mb = max_snapshot_mb or disk_limit_mb
        self.max_output_bytes = max_output_bytes
        self.default_timeout_s = default_timeout_s
        self.prewarm = prewarm
        self.prefer_prebuilt = prefer_prebuilt
        self.registry = registry_settings(registry)
        self.egress = EgressService(
            egress,
            available=not self.rootless,
            unavailable_reason="a rootless local backend cannot reach into "
            "its sandboxes' network namespaces; run as root for network policies other than no-network",
        )
        self._fetcher: ImageFetcher | None = None
        self.store = SnapshotStore(
            Path(store_dir) if store_dir else default_store_dir(), id_offset=self.id_offset, rootless=self.rootless
        )
        self.store.reap()  # staging folders of processes killed mid-snapshot
        self._runtime_root = Path(runtime_dir) if runtime_dir else default_runtime_dir()
        self._cgroup_controllers = cgroups.available() if not self.rootless else set()
        self._host = hostview.discover()
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._sandboxes: dict[int, LocalSandbox] = {}
        self._ready = ReadySandboxes(ready_sandboxes)
        self._daemon: DaemonClient | None = None
        self._run_dir: Path | None = None
        self._bases: dict[str, _Base] = {}
        self._closed = False
        self.tag = f"{os.getpid()}-{secrets.token_hex(4)}"
        """This instance's name: its runtime folder and cgroups carry it, and reap_orphans reads its pid."""
        self._owner = new_owner()
        self._tests = seal.TestsLayers(self.store, id_offset=self.id_offset)
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
        if self._daemon is not None and not self._daemon.is_alive:
            return f"the sandbox daemon died ({self._daemon.log_tail() or 'no message'})"
        return None

    @property
    def capabilities(self) -> Capabilities:
        """What this backend enforces on this machine."""
        cg = self._cgroup_controllers
        return Capabilities(
            in_place_restore=True,
            memory_snapshot=False,
            fork=True,
            gpu=False,
            **self.egress.capability_fields,
            limits={
                "memory": Enforcement.CGROUP if "memory" in cg else Enforcement.RLIMIT,
                "pids": Enforcement.CGROUP if "pids" in cg else Enforcement.RLIMIT,
                "cpu": Enforcement.CGROUP if "cpu" in cg else Enforcement.NONE,
                "disk": Enforcement.TMPFS,
            },
            isolation=("user", "mount", "pid", "network", "ipc", "uts"),
            rootless=self.rootless,
            verification=("strict", "shared"),
            verifier_isolation=_verifier_isolation(kernel.landlock_abi()),
            sandbox_location="node",
            snapshot_location="node",
            bases=(HOST_BASE, "rootfs", "image", "dockerfile"),
            changes="host",
            shell_session=True,
        )

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
        require_supported(template.resources, backend=self.name, gpu=False)
        recipe = self._recipe(template)
        base = self._base(recipe.base)
        identity = combine(base.digest, *(self._base(image).digest for image in recipe.images))
        snap_id = template.content_hash(identity)[:32]
        if cached := self.store.find_usable(snap_id):
            return cached
        with self.store.lock(snap_id):
            if cached := self.store.find_usable(snap_id):
                return cached
            start = Snapshot(
                id=f"base-{snap_id}",
                digest=base.digest,
                backend=self.name,
                layers=base.layers,
                base=recipe.base,
                env=dict(recipe.env),
                workdir="/",
                # the build runs under the backend's limits, not the task's (as docker build does): the
                # task's memory_mb is what an episode gets, and an install can need more than that
                resources=Resources(),
            )
            route = build_route(
                recipe.network,
                proxy_available=self.egress.available,
                why_not=self.egress.unavailable_reason,
                backend=self.name,
            )
            sandbox = self._open(start, network=route is BuildRoute.DIRECT)
            try:
                network = run_recipe(sandbox, recipe, template, copy_from_image=self._copy_from_image, route=route)
                snap = self.snapshot_sandbox(
                    sandbox, snapshot_id=snap_id, template=template, recipe=recipe, build_network=network.record()
                )
            finally:
                sandbox.close()
        return snap

    def create(self, snapshot: Snapshot, *, labels: Mapping[str, str] | None = None) -> LocalSandbox:
        """Start a sandbox at ``snapshot``, carrying ``labels``.

        From a snapshot's second create() on, one more sandbox of it is kept started for the
        next call (``ready_sandboxes``; see pool.backends.local.ready).
        """
        self._check_open()
        self._check_snapshot(snapshot)
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
        self._check_snapshot(snapshot)
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
            self._check_snapshot(snapshot, deep=True)
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
        if self._daemon is not None:
            self._daemon.close()
        if self._run_dir is not None:
            layers.remove_tree(self._run_dir)

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

    # -- used by LocalSandbox -------------------------------------------------

    @property
    def daemon_is_alive(self) -> bool:
        """True while the sandbox daemon runs."""
        return self._daemon is not None and self._daemon.is_alive

    @property
    def daemon_has_died(self) -> bool:
        """True when the daemon was started and is gone (its sandboxes with it)."""
        return self._daemon is not None and not self._daemon.is_alive

    def daemon_request(self, op: Op, sandbox_id: int, fields: Fields) -> dict[str, str]:
        """A control request to the daemon (see daemon.DaemonClient.request)."""
        return self._ensure_daemon().request(op, sandbox_id, fields)

    def daemon_send(self, op: Op, sandbox_id: int, fields: Fields, fds: list[int]) -> None:
        """A request answered on fds (see daemon.DaemonClient.send)."""
        self._ensure_daemon().send(op, sandbox_id, fields, fds)

    def base_env(self, snapshot: Snapshot) -> dict[str, str]:
        """The environment every exec starts from, before the snapshot's own."""
        path = self._host.path_env if snapshot.base == HOST_BASE else hostview.DEFAULT_PATH
        return {"PATH": path, **BASE_ENV}

    def snapshot_sandbox(
        self,
        sandbox: LocalSandbox,
        *,
        snapshot_id: str | None = None,
        template: Template | None = None,
        recipe: Recipe | None = None,
        build_network: Mapping[str, Any] | None = None,
    ) -> Snapshot:
        """Freeze a sandbox's writable layer into a new layer and record it.

        The sandbox's processes are stopped while its writable layer is copied
        (sparse files stay sparse, hard links stay links). A failure, however
        it ends the copy, leaves nothing in the store.

        Raises:
            SnapshotTooLargeError: the writable layer allocates more than ``max_snapshot_mb``.
            StoreFullError: the store's filesystem is full.
        """
        parent = sandbox.start_snapshot
        upper = self.stage_dir(sandbox) / "upper"
        new_layers = parent.layers
        digest = parent.digest
        with self.store.layers.staging(f"snapshotting sandbox {sandbox.id}") as staged:
            sandbox.freeze()
            try:
                is_empty = layers.is_empty_dir(upper)
                if not is_empty:
                    layers.copy_tree(upper, staged, max_bytes=self.max_snapshot_mb * _MIB)
            except SnapshotTooLargeError as exc:
                raise SnapshotTooLargeError(
                    f"snapshot of sandbox {sandbox.id}: {exc}, over LocalBackend(max_snapshot_mb="
                    f"{self.max_snapshot_mb}); nothing was kept: delete files in the sandbox or raise the limit"
                ) from None
            finally:
                sandbox.thaw()
            if not is_empty:
                layer_id, layer_digest = self.store.layers.commit(staged)
                new_layers = (*parent.layers, layer_id)
                digest = combine(parent.digest, layer_digest)
        snap = Snapshot(
            id=snapshot_id or digest[:32],
            digest=digest,
            backend=self.name,
            layers=new_layers,
            base=parent.base,
            env=dict(recipe.env) if recipe else dict(parent.env),
            workdir=recipe.workdir if recipe else parent.workdir,
            template=template.name if template else parent.template,
            parent=None if template else parent.id,
            created_at=time.time(),
            resources=template.resources if template else parent.resources,
            build_network=dict(build_network or {}),
        )
        self.store.save(snap)
        return snap

    def restart_sandbox(self, sandbox: LocalSandbox, snapshot: Snapshot) -> None:
        """Kill a sandbox's processes and start fresh namespaces at ``snapshot``."""
        self._check_snapshot(snapshot)
        sandbox.use_limits(self._limits(snapshot.resources), self._limited_controllers(snapshot.resources))
        reply = self.daemon_request(Op.RESTORE, sandbox.number, self._config(snapshot, network=False, sandbox=sandbox))
        sandbox.stage_path = reply["stage"]

    def seal_sandbox(self, sandbox: LocalSandbox, plan: VerificationPlan) -> VerificationReport:
        """Hand a sandbox to its verifier (see LocalSandbox.begin_verification)."""
        known_good = plan.known_good or sandbox.start_snapshot
        self._check_snapshot(known_good)
        above = seal.agent_layers(sandbox.start_snapshot, known_good)
        fields = seal.seal_fields(
            plan,
            known_good=[self.store.layers.path(layer) for layer in known_good.layers],
            agent=[self.store.layers.path(layer) for layer in above],
            tests_layer=self._tests.layer_for(plan.tests_dir),
        )
        if plan.mode is VerifyMode.STRICT:  # a new instance at the known-good state
            fields = [*self._config(known_good, network=False, sandbox=sandbox), *fields]
        else:
            fields += [("tmpfs_bytes", str(self._disk_bytes(known_good))), ("root_uid", self._sandbox_root_uid())]
        try:
            reply = self.daemon_request(Op.SEAL, sandbox.number, fields)
        except BackendError as exc:  # about this sandbox: it is not running, or its verifier could not start
            if str(exc).startswith("out of memory:"):
                raise SandboxOutOfMemoryError(f"no verifier beside the agent's processes: {exc}") from None
            if sandbox.init_died_of_oom():  # e.g. a tmpfs it filled, charged to its memory
                raise SandboxOutOfMemoryError(
                    f"no verifier beside the agent's processes: they used up the sandbox's memory ({exc})"
                ) from None
            raise SandboxCrashedError(f"the verifier could not take over the sandbox: {exc}") from None
        sandbox.stage_path = reply.get("stage", sandbox.stage_path)
        return seal.parse_report(plan.mode, reply)

    def release_sandbox(self, sandbox: LocalSandbox) -> None:
        """Forget a sandbox and have the daemon kill it."""
        with self._lock:
            self._sandboxes.pop(sandbox.number, None)
        if self.daemon_is_alive:
            self.daemon_request(Op.CLOSE, sandbox.number, [])

    # -- internals ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError("the backend is closed; create a new LocalBackend")

    def _check_snapshot(self, snapshot: Snapshot, *, deep: bool = False) -> None:
        """Refuse a snapshot whose layers or digest the store cannot prove (checked once per process).

        This is what makes ``start_digest`` a verified digest: no sandbox starts
        (create, fork, restore) from a snapshot this check did not pass.
        """
        if not isinstance(snapshot, Snapshot):
            raise ConfigError(f"expected a Snapshot, got {type(snapshot).__name__}; build a Template first")
        if snapshot.backend != self.name:
            raise SnapshotError(f"snapshot {snapshot.id} belongs to the {snapshot.backend!r} backend, not 'local'")
        self.store.check(snapshot, deep=deep)

    def _ensure_daemon(self) -> DaemonClient:
        with self._lock:
            if self._daemon is not None:
                if not self._daemon.is_alive:
                    raise SandboxCrashedError(
                        f"the sandbox daemon died ({self._daemon.log_tail() or 'no message'}); "
                        "create a new LocalBackend"
                    )
                return self._daemon
            self._check_open()
            binary = native.daemon_binary(self.store.root)
            self._runtime_root.mkdir(parents=True, exist_ok=True, mode=0o755)
            run_dir = self._runtime_root / self.tag
            (run_dir / "stage").mkdir(parents=True, exist_ok=True)
            self._run_dir = run_dir
            try:
                self._daemon = DaemonClient(
                    binary, rootless=self.rootless, stage_dir=run_dir / "stage", log_path=run_dir / "daemon.log"
                )
            except BackendError as exc:
                raise kernel.explain_daemon_failure(str(exc), rootless=self.rootless) from None
            return self._daemon

    def stage_dir(self, sandbox: LocalSandbox) -> Path:
        """The sandbox's writable tmpfs (its instance's stage), seen through its keeper's mount namespace."""
        return Path(f"/proc/{sandbox.keeper_pid}/root") / sandbox.stage_path.lstrip("/")

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
        daemon = self._ensure_daemon()
        number = next(self._ids)
        limits = self._limits(snapshot.resources)
        group = cgroups.SandboxCgroup(f"{self.tag}-{number}", limits, self._limited_controllers(snapshot.resources))
        sandbox = LocalSandbox(self, number, snapshot, group, labels)
        try:
            fields = self._config(snapshot, network=network, sandbox=sandbox, spare=spare)
            return sandbox, daemon.submit(Op.CREATE, number, fields)
        except BaseException:
            group.remove()
            raise

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
                reply = pending.result()
                sandbox.stage_path, sandbox.keeper_pid = reply["stage"], int(reply["keeper"])
            except BaseException as exc:
                sandbox._cgroup.remove()
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

    def _limited_controllers(self, resources: Resources) -> set[str]:
        """The hierarchies a sandbox's instances get a cgroup in: only those with a limit to enforce."""
        limits = self._limits(resources)
        wanted = {"memory": limits.memory_bytes, "pids": limits.pids, "cpu": limits.cpus}
        return {name for name in self._cgroup_controllers if wanted.get(name)}

    def _limits(self, resources: Resources) -> cgroups.Limits:
        """A snapshot's resources, the backend's options where it sets none."""
        memory_mb = resources.memory_mb or self.memory_limit_mb
        return cgroups.Limits(
            memory_bytes=memory_mb * _MIB if memory_mb else None,
            cpus=resources.cpus or self.cpus,
            pids=self.pids_limit,
        )

    def _disk_bytes(self, snapshot: Snapshot) -> int:
        return (snapshot.resources.storage_mb or self.disk_limit_mb) * _MIB

    def _config(self, snapshot: Snapshot, *, network: bool, sandbox: LocalSandbox, spare: bool = True) -> Fields:
        fields: list[tuple[str, str]] = []
        for layer_id in reversed(snapshot.layers):  # overlay wants the top layer first
            fields.append(("lower", str(self.store.layers.path(layer_id))))
        if snapshot.base == HOST_BASE:
            for host_path, inside in self._host.binds:
                fields.append(("bind", f"{host_path}\t{inside}\tro"))
        fields += [
            ("tmpfs_bytes", str(self._disk_bytes(snapshot))),
            ("hostname", "sandbox"),
            ("spare", "1" if self.prewarm and spare and not network else "0"),
            ("net", "host" if network else "none"),
            ("root_uid", self._sandbox_root_uid()),
        ]
        if self.rootless:
            fields += [("uid_map", "0 0 1"), ("gid_map", "0 0 1")]
        else:
            fields += [("uid_map", f"0 {self.id_offset} {_ID_RANGE}"), ("gid_map", f"0 {self.id_offset} {_ID_RANGE}")]
        fields += [("cgroup", str(path)) for path in sandbox._cgroup.dirs]
        fields += [("cgset", f"{name}\t{value}") for name, value in sandbox._cgroup.limit_settings()]
        fields += [("rlimit", spec) for spec in self._rlimits(snapshot.resources)]
        return fields

    def _sandbox_root_uid(self) -> str:
        return str(self.id_offset) if not self.rootless else "0"

    def _rlimits(self, resources: Resources) -> list[str]:
        specs = [f"{resource.RLIMIT_CORE}:0:0"]
        limits = self._limits(resources)
        if "pids" not in self._cgroup_controllers and limits.pids:
            specs.append(f"{resource.RLIMIT_NPROC}:{limits.pids}:{limits.pids}")
        if "memory" not in self._cgroup_controllers and limits.memory_bytes:
            specs.append(f"{resource.RLIMIT_DATA}:{limits.memory_bytes}:{limits.memory_bytes}")
        return specs

    # -- bases ----------------------------------------------------------------

    def _recipe(self, template: Template) -> Recipe:
        return recipe_for(
            template,
            base_config=lambda spec: self._base(spec).config,
            host_path=self._host.path_env,
            prefer_prebuilt=self.prefer_prebuilt,
            can_get=self._can_get,
        )

    def _base(self, spec: str) -> _Base:
        with self._lock:
            if spec not in self._bases:
                if spec == HOST_BASE:
                    self._bases[spec] = self._host_base()
                elif spec.startswith(("/", "./", "../", "~")):
                    self._bases[spec] = self._rootfs_base(spec)
                else:
                    self._bases[spec] = self._image_base(spec)
            return self._bases[spec]

    def _can_get(self, image: str) -> bool:
        """Whether an image is in the store or can be fetched now (a prebuilt task image)."""
        try:
            self._base(image)
        except (ImageError, ConfigError):
            return False
        return True

    def _copy_from_image(self, sandbox: Sandbox, step: ImageCopy) -> None:
        """``COPY --from=<image>``: read the files out of the image's layers and write them in."""
        layer_dirs = [self.store.layers.path(layer) for layer in self._base(step.image).layers]
        view = LayerView(layer_dirs, rootless=self.rootless)
        for source in step.sources:
            entries = list(view.walk(source))
            is_dir = stat.S_ISDIR(entries[0].mode)
            target = step.dest if is_dir else file_target(sandbox, step, source)
            for entry in entries:
                _place_entry(sandbox, entry, posixpath.join(target, entry.path) if entry.path else target, step.mode)

    def _host_base(self) -> _Base:
        fingerprint = hostview.fingerprint(self._host)
        name = f"host-{fingerprint[:32]}"
        config = BaseConfig(env={"PATH": self._host.path_env})
        if cached := self._cached_base(name):
            return _Base(cached.layers, cached.digest, config)
        with self.store.layers.staging("writing the host base layer") as staged:
            hostview.write_skeleton(self._host, staged)
            layers.shift_owners(staged, self.id_offset)
            layer_id, layer_digest = self.store.layers.commit(staged)
        seed = f"host:{fingerprint}"
        base = _Base((layer_id,), combine(seed, layer_digest), config)
        self.store.save_base(name, BaseRecord(seed, base.layers, base.digest))
        return base

    def _rootfs_base(self, spec: str) -> _Base:
        source = Path(spec).expanduser()
        if not source.exists():
            raise ConfigError(
                f"template base {spec!r} is neither 'host' nor an existing root filesystem "
                "directory or tarball (make one with: docker export CONTAINER > rootfs.tar)"
            )
        key = source_key(source)
        name = f"rootfs-{key[:32]}"
        if cached := self._cached_base(name):
            return cached
        with self.store.layers.staging(f"unpacking the root filesystem {source}") as staged:
            if source.is_dir():
                layers.extract_rootfs(source, staged)
            else:  # confined like an image layer: no host file linked in, set-id bits kept
                try:
                    unpack_layer(source, staged, rootless=self.rootless, image=spec)
                except ImageError as exc:
                    raise SnapshotError(f"cannot unpack root filesystem {source}: {exc}") from None
            layers.shift_owners(staged, self.id_offset)
            rootfs_id, rootfs_digest = self.store.layers.commit(staged)
        mounts_id, mounts_digest = mount_point_layer(self.store.layers)
        seed = "rootfs"  # the content is all in the layers; where it came from is not state
        base = _Base((rootfs_id, mounts_id), combine(seed, rootfs_digest, mounts_digest))
        self.store.save_base(name, BaseRecord(seed, base.layers, base.digest))
        return base

    def _image_base(self, source: str) -> _Base:
        record, config = image_base(self.store, source, fetcher=self._image_fetcher())
        env = {"PATH": hostview.DEFAULT_PATH, **config.env}
        return _Base(record.layers, record.digest, BaseConfig(env=env, workdir=config.workdir))

    def _image_fetcher(self) -> ImageFetcher:
        with self._lock:
            if self._fetcher is None:
                self._fetcher = ImageFetcher(self.store.root / "oci" / "fetch", settings=self.registry)
            return self._fetcher

    def _cached_base(self, name: str) -> _Base | None:
        """The recorded base, checked against its layers; None when it must be made."""
        record = self.store.find_base(name)
        return None if record is None else _Base(record.layers, record.digest)


def _place_entry(sandbox: Sandbox, entry: Entry, target: str, mode: int | None) -> None:
    quoted = shlex.quote(target)
    if stat.S_ISDIR(entry.mode):
        result = sandbox.exec(f"mkdir -p {quoted}", timeout_s=60)
    elif stat.S_ISLNK(entry.mode):
        link = shlex.quote(os.readlink(entry.host_path))
        result = sandbox.exec(f'mkdir -p "$(dirname {quoted})" && ln -sfn {link} {quoted}', timeout_s=60)
    elif stat.S_ISREG(entry.mode):
        file_mode = mode if mode is not None else stat.S_IMODE(entry.mode)
        sandbox.write_file(target, entry.host_path.read_bytes(), mode=file_mode)
        return
    else:
        return  # sockets, FIFOs and devices are not copied, as in an image build
    if not result.ok:
        raise BuildError(f"COPY --from: cannot create {target}: {result.stderr.strip()[-500:]}")


def _verifier_isolation(landlock_abi: int) -> str:
    if landlock_abi >= 6:
        return "signals+ptrace"
    return "ptrace" if landlock_abi >= 1 else "none"


def _check_positive(**values: float | None) -> None:
    for name, value in values.items():
        if value is not None and not value > 0:
            raise ConfigError(f"LocalBackend({name}=...) must be positive or None, got {value!r}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def registry_settings(value: RegistrySettings | Mapping[str, Any] | None) -> RegistrySettings:
    """RegistrySettings from themselves, a mapping of their fields (a YAML backend option), or None.

    Raises:
        ConfigError: a field RegistrySettings does not have (naming the valid ones).
    """
    if value is None:
        return RegistrySettings()
    if isinstance(value, RegistrySettings):
        return value
    known = {f.name for f in dataclasses.fields(RegistrySettings)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ConfigError(
            f"LocalBackend(registry=...) has no field {', '.join(unknown)}; its fields: {', '.join(sorted(known))}"
        )
    fields = dict(value)
    credentials = fields.get("credentials") or {}
    fields["credentials"] = {
        host: Credentials(**cred) if isinstance(cred, Mapping) else cred for host, cred in dict(credentials).items()
    }
    return RegistrySettings(**fields)
