"""The Docker backend: sandboxes as containers of a real Docker Engine, snapshots as its images.

How the contract maps onto the engine (each module's docstring says why):

- ``build``: a template becomes the image ``<prefix>/snapshot:<content hash>``
  (:mod:`.images.builder`; bases in :mod:`.images.bases`, Dockerfiles through the engine's
  own builder in :mod:`.images.dockerbuild`); its digest is the image ID (:mod:`.images.catalog`).
- ``create``/``fork``: containers started from that image ID, with the helper as
  PID 1, loopback-only network, cgroup limits and no new privileges
  (:mod:`.transport.containers`); ``exec`` runs through the helper, which kills a timed-out
  command's whole tree (:mod:`.transport.execution`); files go through the archive API
  (:mod:`.transport.files`).
- ``snapshot``: pause and commit; ``restore``: a hand-off to a prewarmed spare
  container (:mod:`.sandbox`); ``begin_verification``: :mod:`.verify` (hooks: :mod:`.hooks`).
- ``reap_orphans``: containers and checkpoints of dead processes (:mod:`.transport.reaper`).

The backend is a factory and catalogue: it settles its options once (:mod:`.settings`), holds one
engine link (:mod:`.link`: client, containers, egress, checkpoints in :mod:`.images.checkpoints`) and
hands it to each sandbox, which does its own lifecycle through it; the sandboxes never reach
back into the backend (a ``forget`` callback drops a closed one from the catalogue).

Isolation is what the engine gives a container: mount, PID, network, IPC and
UTS namespaces, cgroups, and, when the engine runs with ``--userns-remap``,
a user namespace (the container's root is an unprivileged id on the host).
``Capabilities`` reads which from ``docker info``.
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import shutil
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pool.backends import csrc
from pool.backends.docker import hooks
from pool.backends.docker.capabilities import capability_range, declared
from pool.backends.docker.images.bases import Bases
from pool.backends.docker.images.builder import Builder
from pool.backends.docker.images.catalog import ROLE, SANDBOX
from pool.backends.docker.images.checkpoints import Checkpoints
from pool.backends.docker.link import EngineLink
from pool.backends.docker.sandbox import DockerSandbox
from pool.backends.docker.settings import MIB, DockerRegistry, DockerSettings, check_positive
from pool.backends.docker.transport import diskquota, engine, helper, reaper
from pool.backends.docker.transport.containers import Containers
from pool.capabilities import Capabilities
from pool.egress.onhost.service import EgressService
from pool.egress.settings import EgressSettings
from pool.errors import BackendError, ConfigError, SnapshotNotFoundError
from pool.labels import OWNER, check_labels, new_owner, owner_closed
from pool.resources import DEFAULT_TIMEOUT_S
from pool.snapshots import Snapshot
from pool.templates import Template


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
        disk_limit_mb: size of each sandbox's writable layer (a task's ``storage_mb`` wins),
            also a limit on its number of files. Held by the engine's own quota where its
            storage driver has one, else by a tmpfs under each layer (overlay2, an engine on
            this machine, root); a backend that can do neither refuses to start, naming why
            (see :mod:`.transport.diskquota`). None: no backend-wide limit (tasks' ``storage_mb`` still
            applies where a way exists); an agent can then fill the engine's disk.
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
        registry: registry mirrors to pull through (a :class:`~.settings.DockerRegistry`, or
            ``{"mirrors": {"docker.io": ["127.0.0.1:5000"]}}``); the engine's own settings give
            credentials, CAs and insecure registries.
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
        disk_limit_mb: int | None = 1024,
        max_output_bytes: int = MIB,
        default_timeout_s: float | None = DEFAULT_TIMEOUT_S,
        prewarm: bool = True,
        image_prefix: str = "snapgym",
        prefer_prebuilt: bool = True,
        api_timeout_s: float = 600.0,
        shared_verification: bool = False,
        egress: EgressSettings | Mapping[str, Any] | None = None,
        registry: DockerRegistry | Mapping[str, Any] | None = None,
    ) -> None:
        mirrors = DockerRegistry.parse(registry)
        settings = DockerSettings(
            owner=new_owner(),
            memory_limit_mb=memory_limit_mb,
            cpus=cpus,
            pids_limit=pids_limit,
            disk_limit_mb=disk_limit_mb,
            max_output_bytes=max_output_bytes,
            default_timeout_s=default_timeout_s,
            prewarm=prewarm,
            image_prefix=image_prefix,
            prefer_prebuilt=prefer_prebuilt,
            shared_verification=shared_verification,
        )
        check_positive("api_timeout_s", api_timeout_s)
        self.base_url = base_url or engine.default_url()
        local_engine = self.base_url.startswith(("unix://", "/")) and os.geteuid() == 0
        egress_service = EgressService(
            egress,
            available=local_engine,
            unavailable_reason="the egress proxy reaches into containers' network "
            "namespaces, which needs root and an engine on this machine (a unix socket)",
        )
        self.client = engine.connect(self.base_url, tls_cert_dir=tls_cert_dir, timeout_s=api_timeout_s)
        try:
            if reason := engine.ping(self.client):
                raise BackendError(reason)
            self.engine = engine.EngineInfo.read(self.client)
            containers = Containers(self.client, helper_volume=helper.ensure_volume(self.client, prefix=image_prefix))
            probe_labels = {OWNER: settings.owner, ROLE: "probe"}
            containers.disk = diskquota.choose(
                self.client.api,
                local_engine=self.base_url.startswith(("unix://", "/")),
                probe=lambda way: containers.probe_disk(helper.image_name(image_prefix), way, probe_labels),
            )
            if disk_limit_mb and not containers.disk.enforcement.is_enforced:
                raise diskquota.refuse_unlimited(containers.disk, disk_limit_mb)
        except BaseException:
            self.client.close()
            raise
        self.bases = Bases(self.client, prefix=image_prefix, base_url=self.base_url, mirrors=mirrors.mirrors)
        self.settings = replace(settings, host_binds=self.bases.host_view.binds)
        self.link = EngineLink(
            self.client,
            containers,
            self.settings,
            egress=egress_service,
            hooks=hooks.new_hooks(self.client.api),
            checkpoints=Checkpoints(),
        )
        self._builder = Builder(self.link, self.bases)
        self._lock = threading.Lock()
        self._sandboxes: dict[str, DockerSandbox] = {}
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
        if csrc.find_compiler() is None:
            return "no C compiler to build the docker backend's helper (apt-get install gcc libc6-dev, or set CC)"
        resolved = cls.resolve_options(options)
        return engine.unavailable_reason(resolved.get("base_url"), resolved.get("tls_cert_dir"))

    @property
    def capabilities(self) -> Capabilities:
        """What the engine enforces, read from ``docker info`` when the backend started (see :mod:`.capabilities`)."""
        return declared(
            self.engine,
            shared_verification=self.settings.shared_verification,
            egress=self.egress.capability_fields,
            disk=self.link.containers.disk.enforcement,
        )

    @classmethod
    def capability_range(cls) -> dict[str, Capabilities]:
        """What the backend declares on a typical machine, then under each condition that changes it (see
        :mod:`.capabilities`), stated without an engine."""
        return capability_range()

    @property
    def health(self) -> str | None:
        """None while the engine answers; otherwise why not."""
        if self.link.is_closed:
            return "the backend is closed"
        return engine.ping(self.client)

    # -- the contract ------------------------------------------------------------------

    def build(self, template: Template) -> Snapshot:
        """The snapshot of a template: its image found by tag, or built (see :mod:`.images.builder`).

        Raises:
            BuildError: a setup step, the Dockerfile or the healthcheck failed; the message holds its output.
            ConfigError: a base or image the engine cannot get (saying how to provide it), or
                resources it cannot give (GPUs, or a ``storage_mb`` where no way limits disks).
            HostBrokenError: the engine stopped answering.
        """
        self._check_open()
        if not isinstance(template, Template):
            raise ConfigError(f"expected a Template, got {type(template).__name__}")
        disk = self.link.containers.disk
        if template.resources.storage_mb and not disk.enforcement.is_enforced:
            raise ConfigError(
                f"template {template.name!r} asks for storage_mb={template.resources.storage_mb}, which this "
                f"Docker backend cannot give: {disk.why_not}"
            )
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
        link = self.link
        link.check_open()
        link.check_snapshot(snapshot)
        given = check_labels(labels)
        link.adopt_checkpoints(snapshot, given)
        ids = [secrets.token_hex(6) for _ in range(n)]
        tags = [{**given, OWNER: self.owner, SANDBOX: sandbox_id} for sandbox_id in ids]
        futures = [link.containers.later(link.start_container, snapshot, t) for t in tags]
        concurrent.futures.wait(futures)
        made: list[DockerSandbox] = []
        error: BaseException | None = None
        for sandbox_id, tag, future in zip(ids, tags, futures, strict=True):
            if future.exception() is not None:
                error = error or future.exception()
                continue
            sandbox = DockerSandbox(link, sandbox_id, future.result(), snapshot, tag, forget=self._forget)
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
            if self.link.is_closed:
                return
            self.link.mark_closed()
            sandboxes = list(self._sandboxes.values())
        for sandbox in sandboxes:
            sandbox.close()
        self.link.egress.close()
        self.link.containers.close()
        self.link.checkpoints.remove(self.api)  # one in use by another backend's container stays
        owner_closed(self.owner)  # what it kept (a run's checkpoints) is for a resume to adopt
        shutil.rmtree(self.link.hooks.folder, ignore_errors=True)
        self.client.close()

    @property
    def is_closed(self) -> bool:
        """True after close()."""
        return self.link.is_closed

    def __enter__(self) -> DockerBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __deepcopy__(self, memo: dict[int, object]) -> DockerBackend:
        """A backend is a shared resource (an engine connection): copies are the same backend."""
        return self

    def __copy__(self) -> DockerBackend:
        return self

    # -- the catalogue ------------------------------------------------------------------

    @property
    def api(self) -> Any:
        """The SDK's low-level client."""
        return self.client.api

    @property
    def owner(self) -> str:
        """The label value that marks this backend's containers and checkpoints."""
        return self.settings.owner

    @property
    def egress(self) -> EgressService:
        """How this backend's sandboxes reach the network (see pool.egress)."""
        return self.link.egress

    def container_state(self, container: str) -> dict[str, Any]:
        """The container's ``State`` (``{}`` when it is gone)."""
        return self.link.container_state(container)

    def check_snapshot(self, snapshot: Snapshot) -> None:
        """Refuse what is not a snapshot of this backend.

        Raises:
            ConfigError: not a Snapshot. SnapshotError: another backend's.
        """
        self.link.check_snapshot(snapshot)

    def find_snapshot(self, snapshot_id: str) -> Snapshot | None:
        """The snapshot tagged ``<prefix>/snapshot:<id>``, or None."""
        return self.link.find_snapshot(snapshot_id)

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        """A template's snapshot by id.

        Raises:
            SnapshotNotFoundError: no image is tagged for it.
        """
        found = self.find_snapshot(snapshot_id)
        if found is None:
            raise SnapshotNotFoundError(f"no snapshot {snapshot_id} in the Docker engine; build its template")
        return found

    def keep_run_checkpoints(self) -> int:
        """Leave the checkpoints of runs in the engine when this backend closes: a runner that stops with
        episodes unfinished (Ctrl-C, an outage) keeps them for its resume, which adopts them. How many."""
        return self.link.checkpoints.keep_runs()

    # -- internals ---------------------------------------------------------------------

    def _forget(self, sandbox_id: str) -> None:
        """A sandbox was closed."""
        with self._lock:
            self._sandboxes.pop(sandbox_id, None)

    def _check_open(self) -> None:
        self.link.check_open()

    def __repr__(self) -> str:
        state = "closed" if self.link.is_closed else "open"
        return f"<DockerBackend {self.base_url} engine {self.engine.version} {state}>"
