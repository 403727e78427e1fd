"""What every cloud backend does the same way, over a :class:`~pool.backends.remote.provider.Provider`.

The backend is a factory and a catalogue: it builds snapshots, makes sandboxes
(each holds a :class:`~pool.backends.remote.link.Link`: the provider, the pace,
the threads and the options, through which it does its own lifecycle), keeps
the open ones to close them with it, and reaps.

Building a template: a provider sandbox starts from the provider's base (it
stands in for snapgym's ``host`` base), the shared recipe runs in it
(:func:`pool.build.images.run_recipe`: setup steps, files, healthcheck) and the
provider freezes it into a snapshot named ``snapgym-<template content
hash>-<workdir digest>`` (the start digest: :mod:`pool.backends.remote.link`),
so a second build of the same template, in any process, finds it by name and
runs nothing.

Leaks. Every provider sandbox carries the caller's labels and
``snapgym.owner`` (this backend) as metadata and the provider's lifetime, so a
client killed with SIGKILL leaves nothing past it; ``reap_orphans`` ends what
dead processes of this machine left, ``reap_run`` every sandbox of a run.
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import dataclasses
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

from pool.backends.remote.credentials import Credentials
from pool.backends.remote.link import PREFIX, Link, Started, recorded
from pool.backends.remote.options import RemoteOptions
from pool.backends.remote.provider import Provider, ProviderImage
from pool.backends.remote.ratelimit import shared_limiter
from pool.backends.remote.sandbox import RemoteSandbox
from pool.build.hostview import DEFAULT_PATH
from pool.build.images import BaseConfig, recipe_for, run_recipe
from pool.build.network import BuildRoute, build_route
from pool.build.registry.taskimages import TaskImages
from pool.capabilities import Capabilities, EgressControl, Enforcement, Location
from pool.errors import ConfigError, SandboxCrashedError
from pool.labels import OWNER, RUN, check_labels, new_owner, owner_is_gone
from pool.resources import Resources, require_supported
from pool.snapshots import BASE_ENV, Snapshot
from pool.templates import HOST_BASE, Template


def cloud_capabilities(**fields: Any) -> Capabilities:
    """What every cloud backend does (hand-offs, strict verification, provider egress without an audit,
    no per-sandbox limits, remote sandboxes and snapshots, the ``host`` base), with ``fields`` on top."""
    shared: dict[str, Any] = {
        "in_place_restore": False,
        "memory_snapshot": False,
        "fork": True,
        "gpu": False,
        "egress_control": EgressControl.PROVIDER,
        "network_modes": ("no-network", "public", "allowlist"),
        "build_network_modes": ("no-network", "public"),
        "limits": dict.fromkeys(("memory", "cpu", "pids", "disk"), Enforcement.NONE),
        "verification": ("strict",),
        "sandbox_location": Location.REMOTE,
        "snapshot_location": Location.REMOTE,
        "bases": ("host",),
    }
    return Capabilities(**{**shared, **fields})


class RemoteBackend(abc.ABC):
    """A cloud backend: a provider plus the pool's guarantees (see the module docstring). A subclass
    gives its constructor's options, its ``credentials``, ``declared_capabilities`` and ``base_identity``."""

    name: str
    credentials: ClassVar[Credentials]
    """What signs the backend in; its constructor resolves them, ``unavailable_reason`` checks them."""

    def __init__(self, provider: Provider, options: RemoteOptions, *, account: str) -> None:
        """``account`` names the account and endpoint (hashed into the shared pace's file name)."""
        self.provider = provider
        self.name = provider.name
        self.owner = new_owner()
        bucket = options.bucket(self.name, account)
        limiter = (
            None
            if options.max_creates_per_s is None
            else shared_limiter(options.max_creates_per_s, options.create_burst, bucket, key=bucket.stem)
        )
        self._workers = concurrent.futures.ThreadPoolExecutor(options.max_workers, thread_name_prefix=self.name)
        self._link = Link(self.name, provider, limiter, self._workers, options, options.sandbox_timeout_s / 2,
                          self._forget)  # fmt: skip
        self._lock = threading.Lock()
        self._sandboxes: dict[str, RemoteSandbox] = {}
        self._images = TaskImages(options.registry, backend=self.name)  # type: ignore[arg-type]
        self._closed = False

    @property
    def options(self) -> RemoteOptions:
        """The cloud options sandboxes made now run with."""
        return self._link.options

    @property
    def sandbox_timeout_s(self) -> int:
        """Each provider sandbox's lifetime at the provider."""
        return self.options.sandbox_timeout_s

    @property
    def prewarm(self) -> bool:
        """Whether sandboxes made from now on keep a spare (settable: a sandbox keeps what it was made with)."""
        return self.options.prewarm

    @prewarm.setter
    def prewarm(self, value: bool) -> None:
        self._link = dataclasses.replace(self._link, options=dataclasses.replace(self.options, prewarm=value))

    @property
    def spare_max_age_s(self) -> float:
        """A spare older than this is replaced rather than handed over (default: half its lifetime;
        settable, for sandboxes made from now on)."""
        return self._link.spare_max_age_s

    @spare_max_age_s.setter
    def spare_max_age_s(self, value: float) -> None:
        self._link = dataclasses.replace(self._link, spare_max_age_s=value)

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

    @classmethod
    def unavailable_reason(cls, **options: Any) -> str | None:
        """Why this backend cannot run here (no credentials in the options or the environment), or None."""
        return cls.credentials.unavailable_reason(options)

    @property
    def health(self) -> str | None:
        """None while open (the provider's outages surface per call, as BackendError)."""
        return f"the {self.name} backend is closed" if self._closed else None

    # -- templates ------------------------------------------------------------

    def build(self, template: Template) -> Snapshot:
        """The provider snapshot of ``template``: found by name, or built.

        A template that starts from a registry image (a task's ``docker_image``, preferred when it can
        be had, or its Dockerfile's ``FROM``) is built in a provider sandbox started from that image,
        pinned to the digest resolved on the host (:mod:`pool.backends.remote.images`).

        Raises:
            BuildError: a setup step or the healthcheck failed (with its output).
            ConfigError: a base the provider cannot start from; GPUs on a backend without them.
            ImageError: the image cannot be had (by the host or the provider).
        """
        self._check_open()
        capabilities = self.capabilities
        require_supported(template.resources, backend=self.name, gpu=capabilities.gpu, gpu_types=capabilities.gpu_types)
        images = self._images
        if "image" in capabilities.bases:
            recipe = recipe_for(
                template, base_config=images.base_config, host_path=DEFAULT_PATH, prefer_prebuilt=True,
                can_get=images.can_get,
            )  # fmt: skip
        else:  # nothing is resolved for a backend that cannot start from it
            recipe = recipe_for(template, base_config=lambda spec: BaseConfig(), host_path=DEFAULT_PATH)
        from_image = recipe.base != HOST_BASE
        if from_image and "image" not in capabilities.bases:
            raise ConfigError(
                f"template {template.name!r} starts from {recipe.base!r}; the {self.name} backend builds only on "
                "the provider's base (snapgym's 'host' base: FROM snapgym/host)"
            )
        if recipe.images and not from_image:
            raise ConfigError(f"template {template.name!r}: COPY --from=<image> needs a Dockerfile FROM an image")
        identity = images.identity(recipe.base, recipe.images) if from_image else f"base:{self.base_identity}"
        content = template.content_hash(f"{self.name}-{identity}")
        name = f"{PREFIX}{content[:24]}"
        draft = Snapshot(
            id=content[:32],
            digest="",
            backend=self.name,
            base=recipe.base,
            env={**(BASE_ENV if not from_image else {}), **recipe.env},
            workdir=recipe.workdir,
            template=template.name,
            resources=template.resources,
            unapplied=unapplied(
                template.resources, self.provider.applied_resources if from_image else self.provider.applied_on_base
            ),
        )
        if found := self.provider.find_snapshot(f"{name}-"):
            reference, full = found
            return recorded(draft, reference, full.rsplit("-", 1)[-1])
        route = build_route(
            recipe.network, proxy_available=False, why_not="provider sandboxes cannot host snapgym's proxy",
            backend=self.name,
        )  # fmt: skip
        labels = {OWNER: self.owner, "snapgym.role": "build"}
        link = dataclasses.replace(self._link, options=dataclasses.replace(self.options, prewarm=False))
        builder = link.create(
            None, labels, internet=route is BuildRoute.DIRECT, resources=template.resources,
            image=provider_image(images, recipe.base) if from_image else None,
        )  # fmt: skip
        sandbox = RemoteSandbox(link, Started(builder, 0), draft, {})  # no spare: nothing restores a build
        try:
            network = run_recipe(sandbox, recipe, template, copy_from_image=images.copy_from_image, route=route)
            snapshot = link.freeze(builder, draft, name)
        finally:
            sandbox.close()
        return dataclasses.replace(snapshot, build_network=network.record())

    @property
    @abc.abstractmethod
    def base_identity(self) -> str:
        """What the provider's base is, for the content hash (a template name, a snapshot name)."""

    # -- sandboxes ------------------------------------------------------------

    def create(self, snapshot: Snapshot, *, labels: Mapping[str, str] | None = None) -> RemoteSandbox:
        """A sandbox starting at ``snapshot``, carrying ``labels``."""
        self._check_open()
        link = self._link
        link.check(snapshot)
        tags = {**check_labels(labels), OWNER: self.owner}
        sandbox = RemoteSandbox(link, link.start(snapshot, tags), snapshot, tags)
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

    def _forget(self, sandbox_id: str) -> None:
        """Drop a closed sandbox from the backend's table."""
        with self._lock:
            self._sandboxes.pop(sandbox_id, None)

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
                with contextlib.suppress(SandboxCrashedError):  # it ended since the list: nothing to end
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

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError(f"the {self.name} backend is closed")


def provider_image(images: TaskImages, spec: str) -> ProviderImage:
    """What the provider is asked to start a build sandbox from: ``spec`` pinned, with its credentials."""
    resolved = images.resolve(spec)
    credentials = resolved.credentials
    return ProviderImage(
        reference=resolved.reference,
        digest=resolved.digest,
        username=credentials.username if credentials else None,
        password=credentials.password if credentials else None,
        insecure=resolved.insecure,
    )


def unapplied(resources: Resources, applied: frozenset[str]) -> tuple[str, ...]:
    """The resources a template asks for that the provider does not set (``memory_mb=4096``...)."""
    asked = {"cpus": resources.cpus, "memory_mb": resources.memory_mb, "storage_mb": resources.storage_mb,
             "gpus": resources.gpus or None}  # fmt: skip
    return tuple(f"{field}={value:g}" for field, value in asked.items() if value is not None and field not in applied)
