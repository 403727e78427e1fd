"""What a sandbox and a build of one Docker backend reach the engine through.

An ``EngineLink`` is one per backend, shared by its sandboxes and its builder: the engine's API
client, the container pool that starts and removes containers on worker threads, the frozen
settings, the egress service, the known-good hooks of shared verification, and the catalogue
operations a sandbox's own lifecycle needs (start a container at a snapshot, read a container's
state, check, find and take snapshots, adopt a run's checkpoints). It knows no sandbox: each
sandbox keeps its own state and does its own snapshot, restore, verification and close.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pool.backends.docker.hooks import KnownGoodHooks
from pool.backends.docker.images import catalog
from pool.backends.docker.images.catalog import ROLE, SNAPSHOT
from pool.backends.docker.images.checkpoints import Checkpoints
from pool.backends.docker.settings import DockerSettings
from pool.backends.docker.transport.containers import Containers, Spec
from pool.egress.onhost.service import EgressService
from pool.errors import ConfigError, SandboxClosedError, SnapshotError
from pool.labels import RUN
from pool.snapshots import Snapshot
from pool.templates import HOST_BASE


class EngineLink:
    """One backend's engine, containers, settings and catalogue, as its sandboxes and builds use them."""

    def __init__(
        self,
        client: Any,
        containers: Containers,
        settings: DockerSettings,
        *,
        egress: EgressService,
        hooks: KnownGoodHooks,
        checkpoints: Checkpoints,
    ) -> None:
        self.client = client
        """The SDK's client (the builder's engine builds go through it)."""
        self.containers = containers
        self.settings = settings
        self.egress = egress
        self.hooks = hooks
        self.checkpoints = checkpoints
        self._closed = False

    @property
    def api(self) -> Any:
        """The SDK's low-level client."""
        return self.client.api

    @property
    def is_closed(self) -> bool:
        """True once the backend closed."""
        return self._closed

    def mark_closed(self) -> None:
        """The backend closed: no container starts through this link any more."""
        self._closed = True

    def check_open(self) -> None:
        """Refuse work once the backend closed.

        Raises:
            SandboxClosedError: it closed.
        """
        if self._closed:
            raise SandboxClosedError("the backend is closed; create a new DockerBackend")

    def start_container(
        self,
        snapshot: Snapshot,
        labels: Mapping[str, str],
        *,
        network: bool = False,
        limit_disk: bool = True,
        what: str = "a sandbox",
    ) -> str:
        """Create and start a container at ``snapshot`` (by its image ID); its id (``limit_disk=False``:
        a build container, which gets no disk limit, like ``docker build``)."""
        self.check_open()
        spec = Spec(
            image_id=snapshot.digest,
            env=snapshot.env,
            labels={**labels, ROLE: labels.get(ROLE, "sandbox"), SNAPSHOT: snapshot.id},
            limits=self.settings.limits(snapshot.resources, disk=limit_disk),
            host_binds=self.settings.host_binds if snapshot.base == HOST_BASE else (),
            network=network,
            what=what,
        )
        return self.containers.start(spec)

    def container_state(self, container: str) -> dict[str, Any]:
        """The container's ``State`` (``{}`` when it is gone)."""
        try:
            return dict(self.api.inspect_container(container).get("State") or {})
        except Exception:
            return {}

    def check_snapshot(self, snapshot: Snapshot) -> None:
        """Refuse what is not a snapshot of this backend.

        Raises:
            ConfigError: not a Snapshot. SnapshotError: another backend's.
        """
        if not isinstance(snapshot, Snapshot):
            raise ConfigError(f"expected a Snapshot, got {type(snapshot).__name__}; build a Template first")
        if snapshot.backend != catalog.BACKEND:
            raise SnapshotError(f"snapshot {snapshot.id} belongs to the {snapshot.backend!r} backend, not 'docker'")

    def find_snapshot(self, snapshot_id: str) -> Snapshot | None:
        """The snapshot tagged ``<prefix>/snapshot:<id>``, or None."""
        return catalog.find(self.api, self.settings.image_prefix, snapshot_id)

    def checkpoint(self, container: str, *, parent: Snapshot, labels: Mapping[str, str]) -> Snapshot:
        """Commit a container (paused meanwhile) of a sandbox with ``labels`` that started at ``parent``
        into a checkpoint image, which the backend removes when it closes (unless its run keeps it)."""
        run = labels.get(RUN)
        snapshot = catalog.checkpoint(
            self.api, container, prefix=self.settings.image_prefix, owner=self.settings.owner, parent=parent, run=run
        )
        self.checkpoints.add(snapshot.digest, run)
        return snapshot

    def adopt_checkpoints(self, snapshot: Snapshot, labels: Mapping[str, str]) -> None:
        """Before a sandbox with ``labels`` starts at ``snapshot``: adopt its run's orphaned checkpoints
        (see :class:`~pool.backends.docker.images.checkpoints.Checkpoints`)."""
        self.checkpoints.adopt(self.api, snapshot, labels)
