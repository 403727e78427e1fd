"""The E2B backend: sandboxes are E2B microVMs, known-good states are E2B snapshots.

Building a template: an E2B sandbox starts from the provider template
``base_template`` (it stands in for snapgym's ``host`` base: E2B's "base" is a
Debian userland with Python, git and curl), the shared recipe runs in it
(:func:`pool.imagebuild.run_recipe`: setup steps, files, healthcheck), and
``create_snapshot`` freezes it (memory and files). The snapshot's E2B name is
``snapgym-<template content hash>-<workdir digest>``, so a second build of the
same template, in any process, finds it by name and runs nothing.

The start digest. A remote sandbox's bytes cannot be hashed from here, so a
snapshot's identity has two parts: the provider's snapshot id (which pins the
whole filesystem and memory as E2B stored them) and a digest snapgym computes
*inside* the sandbox over the snapshot's working directory: every file's path,
content, mode and size and every link's target under it (not the rest of the
filesystem, and not ownership). It is computed when the snapshot is made and
again in every E2B sandbox before it is handed to an episode; a mismatch is a
SnapshotCorruptError. ``Snapshot.digest`` is a hash of both parts.

Lifetimes and leaks. Every E2B sandbox carries the sandbox's labels as
metadata (``snapgym.owner``: this backend; run/pool/attempt from the caller)
and a provider-side lifetime (``sandbox_timeout_s``), so a client killed with
SIGKILL leaves nothing running past it; ``reap_orphans`` kills what a run whose
process is gone left. Credentials come from ``E2B_API_KEY`` (or ``api_key``)
and never enter a sandbox.

Verification is strict only (:mod:`pool.backends.e2b.verify`). Network policies map onto
E2B's egress filter (:mod:`pool.backends.e2b.network`), without an audit of the attempts.
Not yet (``Capabilities`` says so): resource limits (E2B fixes them per template),
image and Dockerfile bases other than ``FROM snapgym/host``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import logging
import os
import random
import shlex
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import e2b

from pool.backends.e2b.errors import provider_errors
from pool.backends.e2b.sandbox import ROOT, E2BSandbox
from pool.buildnetwork import BuildRoute, build_route
from pool.capabilities import Capabilities, Enforcement
from pool.errors import BackendError, BuildError, ConfigError, SnapshotCorruptError, SnapshotNotFoundError
from pool.hostview import DEFAULT_PATH
from pool.imagebuild import BaseConfig, recipe_for, run_recipe
from pool.labels import OWNER, RUN, check_labels, new_owner, owner_is_gone
from pool.ratelimit import CreationLimiter
from pool.resources import require_supported
from pool.snapshots import BASE_ENV, Snapshot
from pool.templates import HOST_BASE, Template

NAME = "e2b"
if logging.getLogger("httpx").level == logging.NOTSET:  # the SDK's client logs every request at INFO
    logging.getLogger("httpx").setLevel(logging.WARNING)
_PREFIX = "snapgym-"
_WORKDIR_DIGEST = "workdir-sha256:"
DIGEST_SCRIPT = (
    "cd / && {{ find {p} -xdev -type f -print0 | sort -z | xargs -0r sha256sum; "
    "find {p} -xdev -print0 | sort -z | xargs -0r stat -c '%n %F %a'; "
    "find {p} -xdev -type l -print0 | sort -z | xargs -0r readlink; }} 2>/dev/null | sha256sum | cut -c1-64"
)
"""What the in-sandbox digest runs (``{p}``: the quoted working directory)."""


class E2BBackend:
    """Sandboxes on E2B (https://e2b.dev), or on a self-hosted E2B, through the ``e2b`` SDK."""

    name = NAME

    def __init__(
        self,
        *,
        api_key: str | None = None,
        domain: str | None = None,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        base_template: str = "base",
        sandbox_timeout_s: int = 3600,
        request_timeout_s: float = 60.0,
        default_timeout_s: float = 600.0,
        max_output_bytes: int = 1 << 20,
        prewarm: bool = True,
        max_workers: int = 8,
        max_creates_per_s: float | None = 5.0,
        create_burst: int = 10,
        create_retries: int = 4,
        rate_limit_file: str | None = None,
    ) -> None:
        """
        Args:
            api_key: the E2B API key; default ``E2B_API_KEY`` from the environment.
            domain: E2B's domain (``E2B_DOMAIN``; default ``e2b.app``), for a self-hosted E2B.
            api_url: the control plane's URL, overriding ``domain`` (a stand-in server, a proxy).
            sandbox_url: where sandboxes' envd answers, overriding ``domain``.
            base_template: the E2B template that builds start from (snapgym's ``host`` base).
            sandbox_timeout_s: each E2B sandbox's lifetime at the provider: it is killed then even
                if this process died without a word. An episode longer than it needs a larger one.
            request_timeout_s: the SDK's timeout for each API call.
            default_timeout_s: a command's timeout when ``exec`` is given none.
            max_output_bytes: a command's output cap per stream when ``exec`` is given none.
            prewarm: keep a spare E2B sandbox per sandbox, so that restore is a hand-off.
            max_workers: threads for background creates and kills.
            max_creates_per_s: sandbox creations per second, on average, for every process on this
                machine that uses the same account and endpoint (None: unpaced). E2B refuses bursts.
            create_burst: creations allowed at once before the pace applies.
            create_retries: how often a create the provider refused for now (429, 5xx: after the SDK's
                own retries) is tried again, with backoff and the same idempotency key.
            rate_limit_file: where the shared pace is kept (default: a file per account and endpoint
                under the user's runtime folder).
        """
        if sandbox_timeout_s < 60:
            raise ConfigError(f"sandbox_timeout_s must be at least 60, got {sandbox_timeout_s}")
        self.api_key = api_key or os.environ.get("E2B_API_KEY")
        if not self.api_key:
            raise ConfigError(_MISSING_KEY)
        self.domain = domain
        self.api_url = api_url
        self.sandbox_url = sandbox_url
        self.base_template = base_template
        self.sandbox_timeout_s = sandbox_timeout_s
        self.request_timeout_s = request_timeout_s
        self.default_timeout_s = default_timeout_s
        self.max_output_bytes = max_output_bytes
        self.prewarm = prewarm
        self.create_retries = create_retries
        self.limiter = (
            None
            if max_creates_per_s is None
            else CreationLimiter(max_creates_per_s, create_burst, rate_limit_file or self._default_bucket())
        )
        self.owner = new_owner()
        self._workers = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="snapgym-e2b")
        self._lock = threading.Lock()
        self._sandboxes: dict[str, E2BSandbox] = {}
        self._verified: set[str] = set()
        self._closed = False

    # -- the contract's class methods ----------------------------------------

    @classmethod
    def resolve_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options as given: the key stays out of them (each process reads ``E2B_API_KEY``)."""
        return dict(options)

    @classmethod
    def unavailable_reason(cls, **options: Any) -> str | None:
        """Why this backend cannot run here (no API key), or None."""
        if not (options.get("api_key") or os.environ.get("E2B_API_KEY")):
            return _MISSING_KEY
        return None

    # -- what it does ---------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        """What the E2B backend does today (see the module docstring for what it does not yet)."""
        return self.declared_capabilities()

    @classmethod
    def declared_capabilities(cls) -> Capabilities:
        """The capabilities, stated without credentials or a connection (they do not depend on options)."""
        return Capabilities(
            in_place_restore=False,
            memory_snapshot=True,
            fork=True,
            gpu=False,
            egress_control="provider",
            network_modes=("no-network", "public", "allowlist"),
            build_network_modes=("no-network", "public"),
            limits=dict.fromkeys(("memory", "cpu", "pids", "disk"), Enforcement.NONE),
            isolation=("microvm",),
            verification=("strict",),
            sandbox_location="remote",
            snapshot_location="remote",
            bases=("host",),
        )

    @property
    def health(self) -> str | None:
        """None while open (the provider's outages surface per call, as BackendError)."""
        return "the backend is closed" if self._closed else None

    # -- templates ------------------------------------------------------------

    def build(self, template: Template) -> Snapshot:
        """The E2B snapshot of ``template``: found by name, or built.

        Raises:
            BuildError: a setup step or the healthcheck failed (with its output).
            ConfigError: a base other than ``host``; resources E2B cannot give per sandbox.
        """
        self._check_open()
        require_supported(template.resources, backend=NAME, gpu=False)
        recipe = recipe_for(
            template,
            base_config=self._base_config,
            host_path=DEFAULT_PATH,
        )
        if recipe.base != HOST_BASE or recipe.images:
            raise ConfigError(
                f"template {template.name!r} starts from {recipe.base!r}; the e2b backend builds only on its base "
                f"template {self.base_template!r} (snapgym's 'host' base: FROM snapgym/host) so far"
            )
        content = template.content_hash(f"e2b-template:{self.base_template}")
        name = f"{_PREFIX}{content[:24]}"
        draft = Snapshot(
            id=content[:32],
            digest="",
            backend=NAME,
            base=HOST_BASE,
            env={**BASE_ENV, **recipe.env},
            workdir=recipe.workdir,
            template=template.name,
            resources=template.resources,
        )
        if found := self._find_snapshot(name):
            return self._recorded(draft, *found)
        route = build_route(
            recipe.network, proxy_available=False, why_not="E2B sandboxes cannot host snapgym's proxy", backend=NAME
        )
        builder = self._create(self.base_template, {OWNER: self.owner, "snapgym.role": "build"},
                               internet=route is BuildRoute.DIRECT)  # fmt: skip
        sandbox = E2BSandbox(self, builder, draft, {})
        try:
            network = run_recipe(sandbox, recipe, template, copy_from_image=_no_image_copy, route=route)
            inside = self._inside_digest(builder, recipe.workdir)
            with provider_errors(f"snapshotting the build of template {template.name!r}"):
                info = builder.create_snapshot(name=f"{name}-{inside}")
        finally:
            sandbox.close()
        snapshot = self._recorded(draft, str(info.snapshot_id), inside)
        return dataclasses.replace(snapshot, build_network=network.record())

    def _base_config(self, spec: str) -> BaseConfig:
        return BaseConfig(env={"PATH": DEFAULT_PATH}, workdir=None)

    def _find_snapshot(self, name: str) -> tuple[str, str] | None:
        """(snapshot id, workdir digest) of the snapshot named ``name-<digest>``, or None."""
        with provider_errors("listing snapshots"):
            pages = e2b.Sandbox.list_snapshots(**self._api())
            while pages.has_next:
                for info in pages.next_items():
                    for full in [str(info.snapshot_id), *map(str, info.names)]:
                        bare = full.rsplit("/", 1)[-1].split(":", 1)[0]
                        if bare.startswith(f"{name}-"):
                            return str(info.snapshot_id), bare.removeprefix(f"{name}-")
        return None

    def _recorded(self, draft: Snapshot, provider_id: str, inside: str) -> Snapshot:
        digest = hashlib.sha256(f"{provider_id}\n{inside}".encode()).hexdigest()
        return dataclasses.replace(draft, digest=digest, layers=(provider_id, f"{_WORKDIR_DIGEST}{inside}"))

    def snapshot_of(self, remote: Any, *, parent: Snapshot) -> Snapshot:
        """A mid-episode snapshot of an E2B sandbox (memory and files)."""
        inside = self._inside_digest(remote, parent.workdir)
        with provider_errors("snapshotting a sandbox"):
            info = remote.create_snapshot()
        snapshot = self._recorded(parent, str(info.snapshot_id), inside)
        return dataclasses.replace(snapshot, id=snapshot.digest[:32], parent=parent.id, template=parent.template)

    def check_snapshot(self, snapshot: Snapshot) -> None:
        """Refuse a snapshot that is not this backend's."""
        if snapshot.backend != NAME or len(snapshot.layers) != 2:
            raise SnapshotNotFoundError(f"snapshot {snapshot.id} was made by the {snapshot.backend!r} backend, not e2b")

    # -- sandboxes ------------------------------------------------------------

    def create(self, snapshot: Snapshot, *, labels: Mapping[str, str] | None = None) -> E2BSandbox:
        """A sandbox starting at ``snapshot``, carrying ``labels``."""
        self._check_open()
        self.check_snapshot(snapshot)
        tags = {**check_labels(labels), OWNER: self.owner}
        sandbox = E2BSandbox(self, self.start(snapshot, tags), snapshot, tags)
        with self._lock:
            self._sandboxes[sandbox.id] = sandbox
        return sandbox

    def fork(self, snapshot: Snapshot, n: int, *, labels: Mapping[str, str] | None = None) -> list[E2BSandbox]:
        """``n`` sandboxes from ``snapshot``, created in parallel."""
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

    def start(self, snapshot: Snapshot, labels: Mapping[str, str]) -> Any:
        """A new E2B sandbox at ``snapshot``, its workdir digest checked."""
        remote = self._create(snapshot.layers[0], labels, internet=False)
        try:
            inside = self._inside_digest(remote, snapshot.workdir)
            if f"{_WORKDIR_DIGEST}{inside}" != snapshot.layers[1]:
                raise SnapshotCorruptError(
                    f"an E2B sandbox from snapshot {snapshot.id} ({snapshot.layers[0]}) has a working directory whose "
                    f"digest {inside[:16]} is not the recorded {snapshot.layers[1][len(_WORKDIR_DIGEST) :][:16]}; "
                    "the provider's snapshot changed: build the template again"
                )
        except BaseException:
            self.kill_later(remote)
            raise
        return remote

    def start_later(self, snapshot: Snapshot, labels: Mapping[str, str]) -> concurrent.futures.Future[Any]:
        """:meth:`start` on a background thread."""
        return self._workers.submit(self.start, snapshot, labels)

    def kill_later(self, remote: Any) -> None:
        """Kill an E2B sandbox on a background thread (a failure is left to its lifetime)."""

        def kill() -> None:
            with contextlib.suppress(Exception):
                remote.kill()

        if self._closed:
            kill()
        else:
            self._workers.submit(kill)

    def kill_now(self, remote: Any) -> None:
        """Kill an E2B sandbox and wait for the answer (a sandbox already gone counts as killed)."""
        with provider_errors("killing a sandbox"):
            remote.kill()

    def forget(self, sandbox: E2BSandbox) -> None:
        """Drop a closed sandbox from the backend's table."""
        with self._lock:
            self._sandboxes.pop(sandbox.id, None)

    def reap_orphans(self) -> int:
        """Kill the E2B sandboxes of snapgym backends whose process is gone; how many owners."""
        owners: dict[str, list[str]] = {}
        with provider_errors("listing sandboxes"):
            pages = e2b.Sandbox.list(**self._api())
            while pages.has_next:
                for info in pages.next_items():
                    owner = (info.metadata or {}).get(OWNER)
                    if owner and owner != self.owner and owner_is_gone(owner):
                        owners.setdefault(owner, []).append(info.sandbox_id)
        for ids in owners.values():
            for sandbox_id in ids:
                with contextlib.suppress(Exception):
                    e2b.Sandbox.kill(sandbox_id, **self._api())
        return len(owners)

    def reap_run(self, run: str, *, dry_run: bool = False) -> list[str]:
        """Kill every E2B sandbox labelled ``snapgym.run=run`` (made anywhere); their ids."""
        found: list[str] = []
        with provider_errors("listing the run's sandboxes"):
            pages = e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={RUN: run}), **self._api())
            while pages.has_next:
                found += [str(info.sandbox_id) for info in pages.next_items()]
        if not dry_run:
            for sandbox_id in found:
                with provider_errors(f"killing {sandbox_id}"):
                    e2b.Sandbox.kill(sandbox_id, **self._api())
        return found

    def close(self) -> None:
        """Kill every sandbox this backend made. Idempotent."""
        if self._closed:
            return
        with self._lock:
            sandboxes = list(self._sandboxes.values())
        for sandbox in sandboxes:
            sandbox.close()
        self._closed = True
        self._workers.shutdown(wait=True)

    def __enter__(self) -> E2BBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers --------------------------------------------------------------

    def _api(self) -> dict[str, Any]:
        """The SDK's connection options (ApiParams)."""
        params: dict[str, Any] = {"api_key": self.api_key, "request_timeout": self.request_timeout_s}
        for key in ("domain", "api_url", "sandbox_url"):
            if (value := getattr(self, key)) is not None:
                params[key] = value
        return params

    def _create(self, template: str, labels: Mapping[str, str], *, internet: bool) -> Any:
        """Create an E2B sandbox, paced by the shared limiter; a refusal for now is retried with
        backoff under the same idempotency key, so a create whose answer was lost is not made twice."""
        key = uuid.uuid4().hex
        for attempt in range(self.create_retries + 1):
            if self.limiter is not None:
                self.limiter.acquire()
            try:
                with provider_errors(f"creating a sandbox from {template}"):
                    return e2b.Sandbox.create(
                        template=template,
                        timeout=self.sandbox_timeout_s,
                        metadata=dict(labels),
                        allow_internet_access=internet,
                        idempotency_key=key,
                        **self._api(),
                    )
            except BackendError:  # ProviderBusyError (429, 503) and other provider failures
                if attempt == self.create_retries:
                    raise
                time.sleep(min(30.0, 0.5 * 2**attempt) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def _default_bucket(self) -> Path:
        account = hashlib.sha256(f"{self.api_key}|{self.api_url or self.domain or 'e2b.app'}".encode()).hexdigest()
        folder = Path(os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/snapgym-{os.getuid()}")
        return folder / "snapgym-ratelimit" / f"e2b-{account[:16]}.bucket"

    def _inside_digest(self, remote: Any, workdir: str) -> str:
        with provider_errors("computing the working directory's digest"):
            result = remote.commands.run(
                DIGEST_SCRIPT.format(p=shlex.quote(workdir)), user=ROOT, timeout=self.request_timeout_s * 5
            )
        digest = str(result.stdout).strip()
        if len(digest) != 64:
            raise BuildError(f"the digest of {workdir} inside an E2B sandbox failed: {result.stderr[-500:]}")
        return digest

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("the e2b backend is closed")


_MISSING_KEY = (
    "E2B_API_KEY is not set: export it (https://e2b.dev/dashboard, API keys) or pass the backend option api_key; "
    "for a self-hosted E2B also set api_url/domain"
)


def _no_image_copy(sandbox: Any, step: Any) -> None:
    raise ConfigError("COPY --from=<image> is not supported on the e2b backend yet")


__all__: Sequence[str] = ("E2BBackend",)
