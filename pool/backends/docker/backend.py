"""The Docker backend: sandboxes as containers of a real Docker Engine, snapshots as its images.

How the contract maps onto the engine (each module's docstring says why):

- ``build``: a template becomes the image ``<prefix>/snapshot:<content hash>``
  (:mod:`.builder`; bases in :mod:`.bases`, Dockerfiles through the engine's
  own builder in :mod:`.dockerbuild`); its digest is the image ID (:mod:`.catalog`).
- ``create``/``fork``: containers started from that image ID, with the helper as
  PID 1, loopback-only network, cgroup limits and no new privileges
  (:mod:`.containers`); ``exec`` runs through the helper, which kills a timed-out
  command's whole tree (:mod:`.execution`); files go through the archive API
  (:mod:`.files`).
- ``snapshot``: pause and commit; ``restore``: a hand-off to a prewarmed spare
  container (:mod:`.sandbox`); ``begin_verification``: :mod:`.verify`.
- ``reap_orphans``: containers and checkpoints of dead processes (:mod:`.reaper`).

Isolation is what the engine gives a container: mount, PID, network, IPC and
UTS namespaces, cgroups, and, when the engine runs with ``--userns-remap``,
a user namespace (the container's root is an unprivileged id on the host).
``Capabilities`` reads which from ``docker info``.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import secrets
import shutil
import threading
from collections.abc import Mapping
from typing import Any

from pool.backends.docker import catalog, engine, helper, reaper, verify
from pool.backends.docker.bases import Bases
from pool.backends.docker.builder import Builder
from pool.backends.docker.capabilities import declared
from pool.backends.docker.catalog import ROLE, SANDBOX, SNAPSHOT
from pool.backends.docker.containers import Containers, Limits, Spec
from pool.backends.docker.sandbox import DockerSandbox
from pool.capabilities import Capabilities
from pool.egress.service import EgressService
from pool.egress.settings import EgressSettings
from pool.errors import (
    BackendError,
    ConfigError,
    SandboxClosedError,
    SnapshotError,
    SnapshotNotFoundError,
)
from pool.labels import OWNER, RUN, check_labels, new_owner, owner_closed
from pool.resources import Resources
from pool.snapshots import Snapshot
from pool.templates import HOST_BASE, Template

_MIB = 1 << 20
_PREFIX = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")


class DockerBackend:
    """Sandboxes as containers of a Docker Engine; snapshots as its images.

    Args:
        base_url: the engine (``unix:///var/run/docker.sock``, ``tcp://host:2376``,
            ``ssh://user@host``); None: ``$DOCKER_HOST``, else the default socket.
        tls_cert_dir: a folder with ``ca.pem``, ``cert.pem`` and ``key.pem`` for a TLS
            engine; None: ``$DOCKER_CERT_PATH`` when ``$DOCKER_TLS_VERIFY`` is set.
        memory_limit_mb: memory per sandbox (cgroup; a task's ``memory_mb`` wins); None: unlimited.
        cpus: CPUs per sandbox, e.g. 1.5 (a task's ``cpus`` wins); None: unlimited.
        pids_limit: processes per sandbox; None: unlimited.
        disk_limit_mb: size of each sandbox's writable layer (needs overlay2 on xfs with
            pquota; the engine refuses it otherwise); None: unlimited. A task's ``storage_mb``
            is not applied (``Capabilities.limits["disk"]`` is "none").
        max_output_bytes: default cap on each of stdout and stderr.
        default_timeout_s: default exec timeout; None: no timeout.
        prewarm: keep a started spare container beside each sandbox, so restore is a hand-off.
        image_prefix: repository prefix of snapgym's images (``<prefix>/snapshot:<id>``, ...).
        prefer_prebuilt: start a Dockerfile template from its prebuilt image when the
            engine has it or can pull it, instead of building the Dockerfile.
        api_timeout_s: how long one request to the engine may take (a commit of a large
            sandbox is one request).
        shared_verification: offer shared verification, in the agent's container (Harbor's
            way): a process the agent leaves running can forge the reward there, so it is off
            unless asked for (see :mod:`.capabilities`).
        egress: how sandboxes reach the network when a policy lets them (a
            ``pool.egress.EgressSettings``, or its fields as a mapping). The proxy runs in this
            process and listens inside each container's network namespace: it needs root and
            an engine on this machine.
    """

    name = "docker"

    def __init__(
        self,
        *,
        base_url: str | None = None,
        tls_cert_dir: str | None = None,
        memory_limit_mb: int | None = 2048,
        cpus: float | None = None,
        pids_limit: int | None = 1024,
        disk_limit_mb: int | None = None,
        max_output_bytes: int = _MIB,
        default_timeout_s: float | None = 600.0,
        prewarm: bool = True,
        image_prefix: str = "snapgym",
        prefer_prebuilt: bool = True,
        api_timeout_s: float = 600.0,
        shared_verification: bool = False,
        egress: EgressSettings | Mapping[str, Any] | None = None,
    ) -> None:
        _check_positive(
            memory_limit_mb=memory_limit_mb,
            cpus=cpus,
            pids_limit=pids_limit,
            disk_limit_mb=disk_limit_mb,
            max_output_bytes=max_output_bytes,
            default_timeout_s=default_timeout_s,
            api_timeout_s=api_timeout_s,
        )
        if not isinstance(image_prefix, str) or not _PREFIX.match(image_prefix):
            raise ConfigError(
                f"DockerBackend(image_prefix={image_prefix!r}) must be a repository name: lowercase letters, "
                "digits, '.', '_', '-', and '/' between parts"
            )
        self.base_url = base_url or engine.default_url()
        local_engine = self.base_url.startswith(("unix://", "/")) and os.geteuid() == 0
        self.egress = EgressService(
            egress, available=local_engine, unavailable_reason="the egress proxy reaches into containers' network "
            "namespaces, which needs root and an engine on this machine (a unix socket)",
        )
        self.memory_limit_mb = memory_limit_mb
        self.cpus = cpus
        self.pids_limit = pids_limit
        self.disk_limit_mb = disk_limit_mb
        self.max_output_bytes = max_output_bytes
        self.default_timeout_s = default_timeout_s
        self.prewarm = prewarm
        self.image_prefix = image_prefix
        self.prefer_prebuilt = prefer_prebuilt
        self.shared_verification = shared_verification
        self.owner = new_owner()
        self.client = engine.connect(self.base_url, tls_cert_dir=tls_cert_dir, timeout_s=api_timeout_s)
        try:
            if reason := engine.ping(self.client):
                raise BackendError(reason)
            self.engine = engine.EngineInfo.read(self.client)
            self.containers = Containers(
                self.client, helper_volume=helper.ensure_volume(self.client, prefix=image_prefix)
            )
            if disk_limit_mb:
                self.containers.check_disk_limit(helper.image_name(image_prefix), disk_limit_mb)
        except BaseException:
            self.client.close()
            raise
        self.bases = Bases(self.client, prefix=image_prefix, base_url=self.base_url)
        self.hooks = verify.new_hooks(self.client.api)
        self._builder = Builder(self)
        self._lock = threading.Lock()
        self._sandboxes: dict[str, DockerSandbox] = {}
        self._checkpoints: dict[str, str | None] = {}
        """The checkpoint images this backend removes when it closes, with the run each serves (or None)."""
        self._adopted_runs: set[str] = set()
        self._closed = False
        self.reap_orphans()

    # -- configuration --------------------------------------------------------------

    @classmethod
    def resolve_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options with the engine settled in this process: ``$DOCKER_HOST`` (else the default
        socket) and ``$DOCKER_CERT_PATH`` become explicit, so every node of a pool talks to the
        engine the driver meant."""
        resolved = dict(options)
        if not resolved.get("base_url"):
            resolved["base_url"] = engine.default_url()
        if (
            not resolved.get("tls_cert_dir")
            and os.environ.get("DOCKER_TLS_VERIFY")
            and os.environ.get("DOCKER_CERT_PATH")
        ):
            resolved["tls_cert_dir"] = os.environ["DOCKER_CERT_PATH"]
        return resolved

    @classmethod
    def unavailable_reason(cls, **options: Any) -> str | None:
        """None when a Docker engine answers a ping at the options' address; else why not, in one line."""
        if helper.find_compiler() is None:
            return "no C compiler to build the docker backend's helper (apt-get install gcc libc6-dev, or set CC)"
        resolved = cls.resolve_options(options)
        return engine.unavailable_reason(resolved.get("base_url"), resolved.get("tls_cert_dir"))

    @property
    def capabilities(self) -> Capabilities:
        """What the engine enforces, read from ``docker info`` when the backend started (see :mod:`.capabilities`)."""
        return declared(self.engine, shared_verification=self.shared_verification, egress=self.egress.capability_fields)

    @property
    def health(self) -> str | None:
        """None while the engine answers; otherwise why not."""
        if self._closed:
            return "the backend is closed"
        return engine.ping(self.client)

    # -- the contract ------------------------------------------------------------------

    def build(self, template: Template) -> Snapshot:
        """The snapshot of a template: its image found by tag, or built (see :mod:`.builder`).

        Raises:
            BuildError: a setup step, the Dockerfile or the healthcheck failed; the message holds its output.
            ConfigError: a base or image the engine cannot get (saying how to provide it), or
                resources it cannot give (GPUs).
            HostBrokenError: the engine stopped answering.
        """
        self._check_open()
        if not isinstance(template, Template):
            raise ConfigError(f"expected a Template, got {type(template).__name__}")
        return self._builder.build(template)

    def create(self, snapshot: Snapshot, *, labels: Mapping[str, str] | None = None) -> DockerSandbox:
        """A sandbox in a new container at ``snapshot``, carrying ``labels``.

        Raises:
            ConfigError: an invalid label.
            SnapshotNotFoundError: the snapshot's image is gone from the engine.
        """
        return self.fork(snapshot, 1, labels=labels)[0]

    def fork(self, snapshot: Snapshot, n: int, *, labels: Mapping[str, str] | None = None) -> list[DockerSandbox]:
        """``n`` sandboxes at ``snapshot``, their containers started concurrently."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"fork needs n >= 1, got {n!r}")
        self._check_open()
        self.check_snapshot(snapshot)
        given = check_labels(labels)
        self.adopt_checkpoints(snapshot, given)
        ids = [secrets.token_hex(6) for _ in range(n)]
        tags = [{**given, OWNER: self.owner, SANDBOX: sandbox_id} for sandbox_id in ids]
        futures = [self.containers.later(self.start_container, snapshot, t) for t in tags]
        concurrent.futures.wait(futures)
        made: list[DockerSandbox] = []
        error: BaseException | None = None
        for sandbox_id, tag, future in zip(ids, tags, futures, strict=True):
            if future.exception() is not None:
                error = error or future.exception()
                continue
            sandbox = DockerSandbox(self, sandbox_id, future.result(), snapshot, tag)
            with self._lock:
                self._sandboxes[sandbox_id] = sandbox
            made.append(sandbox)
        if error is not None:
            for sandbox in made:
                sandbox.close()
            raise error
        for sandbox in made:
            sandbox.prewarm()
        return made

    def reap_orphans(self) -> int:
        """Remove the containers and checkpoint images of processes that are gone; how many runs."""
        return reaper.reap_orphans(self.client)

    def reap_run(self, run: str, *, dry_run: bool = False) -> list[str]:
        """Remove every container labelled ``snapgym.run=run``, whoever made it; their ids."""
        return reaper.reap_run(self.client, run, dry_run=dry_run)

    def close(self) -> None:
        """Remove every container of this backend and its checkpoint images. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sandboxes = list(self._sandboxes.values())
        for sandbox in sandboxes:
            sandbox.close()
        self.egress.close()
        self.containers.close()
        reaper.remove_images(self.api, self._checkpoints)  # one in use by another backend's container stays
        owner_closed(self.owner)  # what it kept (a run's checkpoints) is for a resume to adopt
        shutil.rmtree(self.hooks.folder, ignore_errors=True)
        self.client.close()

    @property
    def is_closed(self) -> bool:
        """True after close()."""
        return self._closed

    def __enter__(self) -> DockerBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __deepcopy__(self, memo: dict[int, object]) -> DockerBackend:
        """A backend is a shared resource (an engine connection): copies are the same backend."""
        return self

    def __copy__(self) -> DockerBackend:
        return self

    # -- used by the sandboxes and the builder ------------------------------------------

    @property
    def api(self) -> Any:
        """The SDK's low-level client."""
        return self.client.api

    def start_container(
        self, snapshot: Snapshot, labels: Mapping[str, str], *, network: bool = False, what: str = "a sandbox"
    ) -> str:
        """Create and start a container at ``snapshot`` (by its image ID); its id."""
        self._check_open()
        spec = Spec(
            image_id=snapshot.digest,
            env=snapshot.env,
            labels={**labels, ROLE: labels.get(ROLE, "sandbox"), SNAPSHOT: snapshot.id},
            limits=self._limits(snapshot.resources),
            host_binds=self.bases.host_view.binds if snapshot.base == HOST_BASE else (),
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
        if snapshot.backend != self.name:
            raise SnapshotError(f"snapshot {snapshot.id} belongs to the {snapshot.backend!r} backend, not 'docker'")

    def find_snapshot(self, snapshot_id: str) -> Snapshot | None:
        """The snapshot tagged ``<prefix>/snapshot:<id>``, or None."""
        return catalog.find(self.api, self.image_prefix, snapshot_id)

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        """A template's snapshot by id.

        Raises:
            SnapshotNotFoundError: no image is tagged for it.
        """
        found = self.find_snapshot(snapshot_id)
        if found is None:
            raise SnapshotNotFoundError(f"no snapshot {snapshot_id} in the Docker engine; build its template")
        return found

    def checkpoint(self, sandbox: DockerSandbox, container: str) -> Snapshot:
        """Commit a sandbox's container (paused meanwhile) into a checkpoint image of this backend."""
        run = sandbox.container_labels.get(RUN)
        snapshot = catalog.checkpoint(
            self.api, container, prefix=self.image_prefix, owner=self.owner, parent=sandbox.start_snapshot, run=run
        )
        with self._lock:
            self._checkpoints[snapshot.digest] = run
        return snapshot

    def keep_run_checkpoints(self) -> int:
        """Leave the checkpoints of runs in the engine when this backend closes: a runner that stops with
        episodes unfinished (Ctrl-C, an outage) keeps them for its resume, which adopts them. How many."""
        with self._lock:
            kept = [image for image, run in self._checkpoints.items() if run]
            for image in kept:
                del self._checkpoints[image]
        return len(kept)

    def adopt_checkpoints(self, snapshot: Snapshot, labels: Mapping[str, str]) -> None:
        """Before a sandbox of run ``labels[RUN]`` starts at checkpoint ``snapshot`` that this backend did not
        take (a resume after the runner was killed): take over every checkpoint of that run whose maker is
        gone, so that this backend removes them when it closes."""
        run = labels.get(RUN)
        if snapshot.parent is None or not run:
            return
        with self._lock:
            if snapshot.digest in self._checkpoints or run in self._adopted_runs:
                return
            self._adopted_runs.add(run)
        found = reaper.dead_checkpoints_of_run(self.api, run)
        with self._lock:
            self._checkpoints.update(dict.fromkeys(found, run))

    def forget(self, sandbox: DockerSandbox) -> None:
        """A sandbox was closed."""
        with self._lock:
            self._sandboxes.pop(sandbox.id, None)

    # -- internals ---------------------------------------------------------------------

    def _limits(self, resources: Resources) -> Limits:
        return Limits(
            memory_mb=resources.memory_mb or self.memory_limit_mb,
            cpus=resources.cpus or self.cpus,
            pids=self.pids_limit,
            disk_mb=self.disk_limit_mb,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError("the backend is closed; create a new DockerBackend")

    def __repr__(self) -> str:
        return f"<DockerBackend {self.base_url} engine {self.engine.version} {'closed' if self._closed else 'open'}>"


def _check_positive(**values: float | None) -> None:
    for name, value in values.items():
        if value is not None and (isinstance(value, bool) or not value > 0):
            raise ConfigError(f"DockerBackend({name}=...) must be positive or None, got {value!r}")
