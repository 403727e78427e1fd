"""What a local sandbox reaches on the host: the daemon, the store's layers, frozen settings.

One ``Runtime`` per backend, shared by its sandboxes. It is the narrow link between a
``LocalSandbox`` and the machinery its backend set up: the sandbox daemon (started on first
use), the snapshot store, the tests layers of verifications, the egress service, and the
daemon fields that describe an instance at a snapshot. It knows nothing of the catalogue of
sandboxes (the backend's) nor of one sandbox's state (the sandbox's).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from pool.backends.local import kernel
from pool.backends.local.cgroups import SandboxCgroup
from pool.backends.local.daemon import build
from pool.backends.local.daemon.client import DaemonClient, Fields, Op, PendingReply
from pool.backends.local.instance import seal
from pool.backends.local.settings import LocalSettings
from pool.backends.local.store import layers
from pool.backends.local.store.catalogue import SnapshotStore
from pool.egress.onhost.service import EgressService
from pool.errors import BackendError, ConfigError, SandboxClosedError, SandboxCrashedError, SnapshotError
from pool.snapshots import Snapshot
from pool.templates import HOST_BASE
from pool.verification import VerificationPlan
from pool.verification.installs import InstallDelta

BACKEND_NAME = "local"
NETNS_STOCK = 256
"""The most new network namespaces the daemon keeps made ahead for new sandboxes (with ``prewarm``): about
80 KiB of kernel memory each; the stock starts at 8 and grows to the largest burst of creates seen."""


class Runtime:
    """The daemon, the store and the settings a backend's sandboxes share; thread-safe.

    Args:
        settings: the backend's options.
        store: the snapshot store.
        runtime_root: where running sandboxes keep their mount points (one folder per backend).
        egress: the backend's egress service (proxies for sandboxes with a network policy).
    """

    def __init__(
        self, settings: LocalSettings, store: SnapshotStore, runtime_root: Path, egress: EgressService
    ) -> None:
        self.settings = settings
        self.store = store
        self.egress = egress
        self.runtime_root = runtime_root
        self.tests = seal.TestsLayers(store, id_offset=settings.id_offset)
        self._lock = threading.Lock()
        self._daemon: DaemonClient | None = None
        self._run_dir: Path | None = None
        self._closed = False

    # -- the daemon -------------------------------------------------------------

    @property
    def started_daemon(self) -> DaemonClient | None:
        """The daemon, if it was started."""
        return self._daemon

    @property
    def daemon_is_alive(self) -> bool:
        """True while the sandbox daemon runs."""
        return self._daemon is not None and self._daemon.is_alive

    @property
    def daemon_has_died(self) -> bool:
        """True when the daemon was started and is gone (its sandboxes with it)."""
        return self._daemon is not None and not self._daemon.is_alive

    def daemon(self) -> DaemonClient:
        """The running daemon, started on first use.

        Raises:
            SandboxClosedError: the runtime is closed (so is its backend).
            SandboxCrashedError: the daemon died.
        """
        with self._lock:
            if self._daemon is not None:
                if not self._daemon.is_alive:
                    raise SandboxCrashedError(
                        f"the sandbox daemon died ({self._daemon.log_tail() or 'no message'}); "
                        "create a new LocalBackend"
                    )
                return self._daemon
            if self._closed:
                raise SandboxClosedError("the backend is closed; create a new LocalBackend")
            binary = build.daemon_binary(self.store.root)
            self.runtime_root.mkdir(parents=True, exist_ok=True, mode=0o755)
            run_dir = self.runtime_root / self.settings.tag
            (run_dir / "stage").mkdir(parents=True, exist_ok=True)
            self._run_dir = run_dir
            rootless = self.settings.rootless
            try:
                self._daemon = DaemonClient(
                    binary,
                    rootless=rootless,
                    stage_dir=run_dir / "stage",
                    log_path=run_dir / "daemon.log",
                    netns_stock=NETNS_STOCK if self.settings.prewarm else 0,
                    keep_mounts=[self.store.root, *(Path(source) for source, _ in self.settings.host.binds)],
                )
            except BackendError as exc:
                raise kernel.explain_daemon_failure(str(exc), rootless=rootless) from None
            return self._daemon

    def request(self, op: Op, number: int, fields: Fields) -> dict[str, str]:
        """A control request about sandbox ``number`` (see daemon.DaemonClient.request)."""
        return self.daemon().request(op, number, fields)

    def send(self, op: Op, number: int, fields: Fields, fds: list[int]) -> None:
        """A request about sandbox ``number`` answered on fds (see daemon.DaemonClient.send)."""
        self.daemon().send(op, number, fields, fds)

    def submit(self, op: Op, number: int, fields: Fields) -> PendingReply:
        """A request whose reply is not waited for (see daemon.DaemonClient.submit)."""
        return self.daemon().submit(op, number, fields)

    # -- the store --------------------------------------------------------------

    def check_snapshot(self, snapshot: Snapshot, *, deep: bool = False) -> None:
        """Refuse a snapshot whose layers or digest the store cannot prove (checked once per process).

        This is what makes ``start_digest`` a verified digest: no sandbox starts
        (create, fork, restore, a strict verifier) from a snapshot this check did not pass.
        """
        if not isinstance(snapshot, Snapshot):
            raise ConfigError(f"expected a Snapshot, got {type(snapshot).__name__}; build a Template first")
        if snapshot.backend != BACKEND_NAME:
            raise SnapshotError(f"snapshot {snapshot.id} belongs to the {snapshot.backend!r} backend, not 'local'")
        self.store.check(snapshot, deep=deep)

    def layer_paths(self, layer_ids: tuple[str, ...]) -> list[Path]:
        """The folders of stored layers, bottom first."""
        return [self.store.layers.path(layer_id) for layer_id in layer_ids]

    # -- what the daemon is told ------------------------------------------------

    def instance_fields(
        self, snapshot: Snapshot, *, network: bool, cgroup: SandboxCgroup, spare: bool = True
    ) -> list[tuple[str, str]]:
        """The CREATE/RESTORE fields of an instance at ``snapshot`` in ``cgroup``.

        ``network``: the host's network (a build step that asked for it); ``spare`` False:
        no next instance is set up beside this one until the next restore.
        """
        settings = self.settings
        # overlay wants the top layer first
        fields: list[tuple[str, str]] = [("lower", str(path)) for path in reversed(self.layer_paths(snapshot.layers))]
        if snapshot.base == HOST_BASE:
            fields += [("bind", f"{host_path}\t{inside}\tro") for host_path, inside in settings.host.binds]
        fields += [
            ("tmpfs_bytes", str(settings.disk_bytes(snapshot))),
            ("hostname", "sandbox"),
            ("spare", "1" if settings.prewarm and spare and not network else "0"),
            ("net", "host" if network else "none"),
            ("root_uid", settings.root_uid),
            *settings.id_maps(),
        ]
        fields += [("cgroup", str(path)) for path in cgroup.dirs]
        fields += [("cgset", f"{name}\t{value}") for name, value in cgroup.limit_settings()]
        fields += [("rlimit", spec) for spec in settings.rlimits(snapshot.resources)]
        return fields

    def seal_fields(
        self, start: Snapshot, plan: VerificationPlan, cgroup: SandboxCgroup, *, graft: Path | None = None
    ) -> list[tuple[str, str]]:
        """The SEAL fields that hand a sandbox started at ``start`` to the verifier of ``plan`` (``graft``:
        a toolchain verifier's install delta, a stored layer put above the known-good ones)."""
        known_good = plan.known_good or start
        self.check_snapshot(known_good)
        fields = seal.seal_fields(
            plan,
            known_good=self.layer_paths(known_good.layers),
            agent=self.layer_paths(seal.agent_layers(start, known_good)),
            tests_layer=self.tests.layer_for(plan.tests_dir),
        )
        if plan.mode.is_separate:  # a new instance at the known-good state
            instance = self.instance_fields(known_good, network=False, cgroup=cgroup)
            if graft is not None:  # overlay wants the top layer first
                instance.insert(next(i for i, (key, _) in enumerate(instance) if key == "lower"), ("lower", str(graft)))
            return [*instance, *fields]
        return [
            *fields,
            ("tmpfs_bytes", str(self.settings.disk_bytes(known_good))),
            ("root_uid", self.settings.root_uid),
        ]

    def graft_installs(
        self,
        start: Snapshot,
        plan: VerificationPlan,
        upper: Path,
        *,
        pause: Callable[[], None],
        resume: Callable[[], None],
    ) -> tuple[Path | None, InstallDelta]:
        """The stored layer of the agent's installs that a toolchain verifier of ``plan`` gets (None:
        nothing to graft) and their delta, from ``upper``, the writable layer of a sandbox started at ``start``
        (see seal.graft_installs)."""
        known_good = plan.known_good or start
        self.check_snapshot(known_good)
        return seal.graft_installs(
            self.store,
            self.settings,
            start,
            known_good,
            known_good_layers=self.layer_paths(known_good.layers),
            upper=upper,
            pause=pause,
            resume=resume,
        )

    # -- the end ----------------------------------------------------------------

    def close(self) -> None:
        """Stop the daemon (every sandbox with it) and remove the runtime folder. Idempotent."""
        with self._lock:
            self._closed = True
        if self._daemon is not None:
            self._daemon.close()
        if self._run_dir is not None:
            layers.remove_tree(self._run_dir)
