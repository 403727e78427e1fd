"""What every cloud backend does the same way, over a :class:`~pool.backends.remote.provider.Provider`.

Building a template: a provider sandbox starts from the provider's base (it
stands in for snapgym's ``host`` base), the shared recipe runs in it
(:func:`pool.build.images.run_recipe`: setup steps, files, healthcheck) and the
provider freezes it into a snapshot named ``snapgym-<template content
hash>-<workdir digest>``, so a second build of the same template, in any
process, finds it by name and runs nothing.

The start digest. A remote sandbox's bytes cannot be hashed from here, so a
snapshot's identity has two parts: the provider's snapshot reference (which
pins what the provider stored) and a digest snapgym computes *inside* the
sandbox over the snapshot's working directory (:data:`DIGEST_SCRIPT`: every
file's path, content and mode, every link's target, each entry's type; not
ownership, not the rest of the filesystem). It is computed when the snapshot
is made and again in every provider sandbox before it is handed to an
episode; a mismatch is a SnapshotCorruptError. ``Snapshot.digest`` is a hash
of both parts, ``Snapshot.layers`` holds them.

Leaks and bursts. Every provider sandbox carries the caller's labels and
``snapgym.owner`` (this backend) as metadata and the provider's lifetime, so a
client killed with SIGKILL leaves nothing past it; ``reap_orphans`` ends what
dead processes of this machine left, ``reap_run`` every sandbox of a run.
Creations go through a token bucket shared by every process on the machine
that uses the same account, or of the Ray cluster (:mod:`pool.backends.remote.ratelimit`), and a create refused for
now is retried with backoff under one idempotency key.
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import os
import random
import shlex
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pool.backends.remote.provider import Provider
from pool.backends.remote.ratelimit import shared_limiter
from pool.backends.remote.sandbox import RemoteSandbox
from pool.build.hostview import DEFAULT_PATH
from pool.build.images import BaseConfig, recipe_for, run_recipe
from pool.build.network import BuildRoute, build_route
from pool.capabilities import Capabilities, Enforcement
from pool.errors import BackendError, BuildError, ConfigError, SnapshotCorruptError, SnapshotNotFoundError
from pool.labels import OWNER, RUN, check_labels, new_owner, owner_is_gone
from pool.resources import Resources, require_supported
from pool.snapshots import BASE_ENV, Snapshot
from pool.templates import HOST_BASE, Template

PREFIX = "snapgym-"
WORKDIR_DIGEST = "workdir-sha256:"
DIGEST_SCRIPT = (
    "cd / && {{ find {p} -xdev -type f -print0 | sort -z | xargs -0r sha256sum; "
    "find {p} -xdev -print0 | sort -z | xargs -0r stat -c '%n %F %a'; "
    "find {p} -xdev -type l -print0 | sort -z | xargs -0r readlink; }} 2>/dev/null | sha256sum | cut -c1-64; "
    "read -r line < /proc/$$/stat && set -- ${{line##*) }} && echo ${{20}}"
)
"""What the in-sandbox digest runs (``{p}``: the quoted working directory). Its second line is the
start time of the digest's shell (clock ticks since the sandbox's boot): every process started
later is the agent's (see :class:`Started`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Started:
    """A provider sandbox whose start digest was checked, ready to be handed to an episode."""

    remote: Any
    since_ticks: int
    """When the check ran, in the sandbox's clock ticks since boot (``/proc/PID/stat`` field 22): the
    processes started at or after it are the episode's, the ones before it the provider's."""


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteSettings:
    """The options every cloud backend takes (see each backend's constructor for their meaning)."""

    sandbox_timeout_s: int = 3600
    request_timeout_s: float = 60.0
    default_timeout_s: float = 600.0
    max_output_bytes: int = 1 << 20
    prewarm: bool = True
    max_workers: int = 8
    max_creates_per_s: float | None = 5.0
    create_burst: int = 10
    create_retries: int = 4
    rate_limit_file: str | None = None

    def __post_init__(self) -> None:
        if self.sandbox_timeout_s < 60:
            raise ConfigError(f"sandbox_timeout_s must be at least 60, got {self.sandbox_timeout_s}")
        if self.max_output_bytes < 1 or self.default_timeout_s <= 0 or self.create_retries < 0:
            raise ConfigError("max_output_bytes and default_timeout_s must be positive, create_retries >= 0")


def cloud_capabilities(**fields: Any) -> Capabilities:
    """What every cloud backend does (hand-offs, strict verification, provider egress without an audit,
    no per-sandbox limits, remote sandboxes and snapshots, the ``host`` base), with ``fields`` on top."""
    shared: dict[str, Any] = {
        "in_place_restore": False,
        "memory_snapshot": False,
        "fork": True,
        "gpu": False,
        "egress_control": "provider",
        "network_modes": ("no-network", "public", "allowlist"),
        "build_network_modes": ("no-network", "public"),
        "limits": dict.fromkeys(("memory", "cpu", "pids", "disk"), Enforcement.NONE),
        "verification": ("strict",),
        "sandbox_location": "remote",
        "snapshot_location": "remote",
        "bases": ("host",),
    }
    return Capabilities(**{**shared, **fields})


class RemoteBackend(abc.ABC):
    """A cloud backend: a provider plus the pool's guarantees (see the module docstring). A subclass
    gives its constructor's options, ``unavailable_reason``, ``declared_capabilities`` and ``base_identity``."""

    name: str

    def __init__(self, provider: Provider, settings: RemoteSettings, *, account: str) -> None:
        """``account`` names the account and endpoint (hashed into the shared pace's file name)."""
        self.provider = provider
        self.name = provider.name
        self.settings = settings
        self.sandbox_timeout_s = settings.sandbox_timeout_s
        self.request_timeout_s = settings.request_timeout_s
        self.default_timeout_s = settings.default_timeout_s
        self.max_output_bytes = settings.max_output_bytes
        self.prewarm = settings.prewarm
        self.spare_max_age_s = settings.sandbox_timeout_s / 2
        """A spare older than this is replaced rather than handed over (it would end under a long episode)."""
        bucket = Path(settings.rate_limit_file) if settings.rate_limit_file else _default_bucket(self.name, account)
        self.limiter = (
            None
            if settings.max_creates_per_s is None
            else shared_limiter(settings.max_creates_per_s, settings.create_burst, bucket, key=bucket.stem)
        )
        self.owner = new_owner()
        self._workers = concurrent.futures.ThreadPoolExecutor(settings.max_workers, thread_name_prefix=self.name)
        self._lock = threading.Lock()
        self._sandboxes: dict[str, RemoteSandbox] = {}
        self._closed = False

    @classmethod
    @abc.abstractmethod
    def declared_capabilities(cls) -> Capabilities:
        """The capabilities, stated without credentials or a connection."""

    @property
    def capabilities(self) -> Capabilities:
        """What the backend does (the same whatever its options)."""
        return self.declared_capabilities()

    @classmethod
    def resolve_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options as given: credentials stay out of them (each process reads its environment)."""
        return dict(options)

    @property
    def health(self) -> str | None:
        """None while open (the provider's outages surface per call, as BackendError)."""
        return f"the {self.name} backend is closed" if self._closed else None

    # -- templates ------------------------------------------------------------

    def build(self, template: Template) -> Snapshot:
        """The provider snapshot of ``template``: found by name, or built.

        Raises:
            BuildError: a setup step or the healthcheck failed (with its output).
            ConfigError: a base other than ``host``; GPUs.
        """
        self._check_open()
        capabilities = self.capabilities
        require_supported(template.resources, backend=self.name, gpu=capabilities.gpu, gpu_types=capabilities.gpu_types)
        recipe = recipe_for(template, base_config=lambda spec: BaseConfig(), host_path=DEFAULT_PATH)
        if recipe.base != HOST_BASE or recipe.images:
            raise ConfigError(
                f"template {template.name!r} starts from {recipe.base!r}; the {self.name} backend builds only on "
                "the provider's base (snapgym's 'host' base: FROM snapgym/host) so far"
            )
        content = template.content_hash(f"{self.name}-base:{self.base_identity}")
        name = f"{PREFIX}{content[:24]}"
        draft = Snapshot(
            id=content[:32],
            digest="",
            backend=self.name,
            base=HOST_BASE,
            env={**BASE_ENV, **recipe.env},
            workdir=recipe.workdir,
            template=template.name,
            resources=template.resources,
        )
        if found := self.provider.find_snapshot(f"{name}-"):
            reference, full = found
            return self._recorded(draft, reference, full.rsplit("-", 1)[-1])
        route = build_route(
            recipe.network, proxy_available=False, why_not="provider sandboxes cannot host snapgym's proxy",
            backend=self.name,
        )  # fmt: skip
        labels = {OWNER: self.owner, "snapgym.role": "build"}
        builder = self._create(None, labels, internet=route is BuildRoute.DIRECT, resources=template.resources)
        sandbox = RemoteSandbox(self, Started(builder, 0), draft, {})
        try:
            network = run_recipe(sandbox, recipe, template, copy_from_image=_no_image_copy, route=route)
            inside = self.inside_digest(builder, recipe.workdir)
            reference = self.provider.make_snapshot(builder, f"{name}-{inside}")
        finally:
            sandbox.close()
        return dataclasses.replace(self._recorded(draft, reference, inside), build_network=network.record())

    @property
    @abc.abstractmethod
    def base_identity(self) -> str:
        """What the provider's base is, for the content hash (a template name, a snapshot name)."""

    def snapshot_of(self, remote: Any, *, parent: Snapshot) -> Snapshot:
        """A mid-episode snapshot of a provider sandbox."""
        inside = self.inside_digest(remote, parent.workdir)
        reference = self.provider.make_snapshot(remote, f"{PREFIX}checkpoint-{uuid.uuid4().hex[:16]}-{inside}")
        snapshot = self._recorded(parent, reference, inside)
        return dataclasses.replace(snapshot, id=snapshot.digest[:32], parent=parent.id, template=parent.template)

    def check_snapshot(self, snapshot: Snapshot) -> None:
        """Refuse a snapshot that is not this backend's."""
        if snapshot.backend != self.name or len(snapshot.layers) != 2:
            raise SnapshotNotFoundError(
                f"snapshot {snapshot.id} was made by the {snapshot.backend!r} backend, not {self.name}"
            )

    def _recorded(self, draft: Snapshot, reference: str, inside: str) -> Snapshot:
        digest = hashlib.sha256(f"{reference}\n{inside}".encode()).hexdigest()
        return dataclasses.replace(draft, digest=digest, layers=(reference, f"{WORKDIR_DIGEST}{inside}"))

    # -- sandboxes ------------------------------------------------------------

    def create(self, snapshot: Snapshot, *, labels: Mapping[str, str] | None = None) -> RemoteSandbox:
        """A sandbox starting at ``snapshot``, carrying ``labels``."""
        self._check_open()
        self.check_snapshot(snapshot)
        tags = {**check_labels(labels), OWNER: self.owner}
        sandbox = RemoteSandbox(self, self.start(snapshot, tags), snapshot, tags)
        with self._lock:
            self._sandboxes[sandbox.id] = sandbox
        return sandbox

    def fork(self, snapshot: Snapshot, n: int, *, labels: Mapping[str, str] | None = None) -> list[RemoteSandbox]:
        """``n`` sandboxes from ``snapshot``, created in parallel (as fast as the pace allows)."""
        if n < 1:
            raise ConfigError(f"fork needs n >= 1, got {n}")
        futures = [self._workers.submit(self.create, snapshot, labels=labels) for _ in range(n)]
        made, error = [], None
        for future in futures:
            try:
                made.append(future.result())
            except Exception as exc:  # the first error is raised after the others are closed
                error = error or exc
        if error is not None:
            for sandbox in made:
                sandbox.close()
            raise error
        return made

    def start(self, snapshot: Snapshot, labels: Mapping[str, str]) -> Started:
        """A new provider sandbox at ``snapshot``, its workdir digest checked."""
        remote = self._create(snapshot.layers[0], labels, resources=snapshot.resources)
        try:
            inside, since = self._probe(remote, snapshot.workdir)
            if f"{WORKDIR_DIGEST}{inside}" != snapshot.layers[1]:
                raise SnapshotCorruptError(
                    f"a {self.name} sandbox from snapshot {snapshot.id} ({snapshot.layers[0]}) has a working "
                    f"directory whose digest {inside[:16]} is not the recorded "
                    f"{snapshot.layers[1][len(WORKDIR_DIGEST) :][:16]}; the provider's snapshot changed: build again"
                )
        except BaseException:
            self.kill_later(remote)
            raise
        return Started(remote, since)

    def start_later(self, snapshot: Snapshot, labels: Mapping[str, str]) -> concurrent.futures.Future[Started]:
        """:meth:`start` on a background thread."""
        return self._workers.submit(self.start, snapshot, labels)

    def kill_later(self, remote: Any) -> None:
        """End a provider sandbox on a background thread (a failure is left to its lifetime)."""

        def kill() -> None:
            with contextlib.suppress(Exception):
                self.provider.kill(remote)

        if self._closed:
            kill()
        else:
            self._workers.submit(kill)

    def forget(self, sandbox: RemoteSandbox) -> None:
        """Drop a closed sandbox from the backend's table."""
        with self._lock:
            self._sandboxes.pop(sandbox.id, None)

    def reap_orphans(self) -> int:
        """End the sandboxes of snapgym processes of this machine that are gone; how many owners."""
        owners: dict[str, list[str]] = {}
        for listed in self.provider.listed({}):
            owner = listed.labels.get(OWNER)
            if owner and owner != self.owner and owner_is_gone(owner):
                owners.setdefault(owner, []).append(listed.sandbox_id)
        for ids in owners.values():
            for sandbox_id in ids:
                with contextlib.suppress(Exception):
                    self.provider.kill_id(sandbox_id)
        return len(owners)

    def reap_run(self, run: str, *, dry_run: bool = False) -> list[str]:
        """End every sandbox labelled ``snapgym.run=run`` (made anywhere); their ids."""
        found = [listed.sandbox_id for listed in self.provider.listed({RUN: run})]
        if not dry_run:
            for sandbox_id in found:
                self.provider.kill_id(sandbox_id)
        return found

    def reap_labelled(self, labels: Mapping[str, str]) -> int:
        """End every sandbox carrying all of ``labels`` (a dead pool host's); how many."""
        found = [listed.sandbox_id for listed in self.provider.listed(dict(labels))]
        for sandbox_id in found:
            with contextlib.suppress(Exception):
                self.provider.kill_id(sandbox_id)
        return len(found)

    def close(self) -> None:
        """End every sandbox this backend made. Idempotent."""
        if self._closed:
            return
        with self._lock:
            sandboxes = list(self._sandboxes.values())
        for sandbox in sandboxes:
            sandbox.close()
        self._closed = True
        self._workers.shutdown(wait=True)
        self.provider.close()

    def __enter__(self) -> RemoteBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers --------------------------------------------------------------

    def _create(
        self,
        source: str | None,
        labels: Mapping[str, str],
        *,
        internet: bool = False,
        resources: Resources | None = None,
    ) -> Any:
        """Create a provider sandbox, paced by the shared limiter; a refusal for now is retried with
        backoff under the same idempotency key, so a create whose answer was lost is not made twice."""
        key = uuid.uuid4().hex
        for attempt in range(self.settings.create_retries + 1):
            if self.limiter is not None:
                self.limiter.acquire()
            try:
                return self.provider.create(source, labels, idempotency_key=key, internet=internet, resources=resources)
            except BackendError:  # ProviderBusyError (429, 503) and other provider failures
                if attempt == self.settings.create_retries:
                    raise
                time.sleep(min(30.0, 0.5 * 2**attempt) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def inside_digest(self, remote: Any, workdir: str) -> str:
        """The digest of ``workdir`` computed inside a provider sandbox (see :data:`DIGEST_SCRIPT`)."""
        return self._probe(remote, workdir)[0]

    def _probe(self, remote: Any, workdir: str) -> tuple[str, int]:
        """(the digest of ``workdir``, the start time of the shell that computed it)."""
        result = self.provider.run(
            remote, DIGEST_SCRIPT.format(p=shlex.quote(workdir)), cwd="/", env={},
            timeout_s=self.request_timeout_s * 5, cap=4096,
        )  # fmt: skip
        lines = result.stdout.split()
        if result.exit_code != 0 or len(lines) != 2 or len(lines[0]) != 64 or not lines[1].isdigit():
            raise BuildError(f"the digest of {workdir} inside a {self.name} sandbox failed: {result.stderr[-500:]}")
        return lines[0], int(lines[1])

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError(f"the {self.name} backend is closed")


def _default_bucket(name: str, account: str) -> Path:
    digest = hashlib.sha256(account.encode()).hexdigest()[:16]
    folder = Path(os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/snapgym-{os.getuid()}")
    return folder / "snapgym-ratelimit" / f"{name}-{digest}.bucket"


def _no_image_copy(sandbox: Any, step: Any) -> None:
    raise ConfigError("COPY --from=<image> is not supported on cloud backends yet")
