"""Where an environment's sandboxes come from: a backend in this process, or a SandboxPool.

Which one is decided once, by whoever opens the source (:func:`open_source` for
``gym.make(..., backend=...)`` or ``pool=...``; the runner's supply for a run),
and the environment only speaks :class:`SandboxSource`.

With a backend, reset restores the sandbox in place (a sub-millisecond
hand-off to a pre-warmed spare on the local backend). With a pool, reset
hands the used sandbox back (the pool restores it in the background) and
leases a ready one: the way to spread environments over a Ray cluster.
Checkpoints are restored in place in both cases, because a checkpoint lives
on the node where it was taken.

A source prepares each template once: the runner builds a task's snapshot
through the same source its environments use, so theirs is a lookup.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from envs.episode.default_backend import DEFAULT_BACKEND, shared_backend
from pool.capabilities import Capabilities
from pool.contract import Backend, Sandbox
from pool.errors import ConfigError, SandboxError, SnapgymError
from pool.labels import check_labels
from pool.snapshots import Snapshot
from pool.templates import Template


class SandboxLeaser(Protocol):
    """What a source needs of a pool of warm sandboxes (:class:`pool.SandboxPool` is one)."""

    @property
    def capabilities(self) -> Capabilities:
        """What the pool's backend does."""
        ...

    def add(self, template: Template) -> Snapshot:
        """Build the template on the pool's hosts and keep warm sandboxes of it."""
        ...

    def acquire(self, snapshot: Snapshot) -> Sandbox:
        """A ready sandbox at ``snapshot``; closing it hands it back."""
        ...


class SandboxSource(Protocol):
    """What an environment needs to get sandboxes."""

    @property
    def name(self) -> str:
        """The backend's name (``"pool"`` for a pool), for ``info["backend"]``."""
        ...

    @property
    def description(self) -> str:
        """Where the sandboxes come from, for messages (``the 'local' backend``)."""
        ...

    @property
    def capabilities(self) -> Capabilities:
        """What the sandboxes of this source can do."""
        ...

    @property
    def backend(self) -> Backend | None:
        """The backend that makes the sandboxes in this process (None: they come from a pool)."""
        ...

    def prepare(self, template: Template) -> Snapshot:
        """Build (or find) the template's snapshot; a template already prepared here is a lookup."""
        ...

    def place(self, current: Sandbox | None, target: Snapshot, *, task_snapshot: Snapshot) -> Sandbox:
        """A sandbox at ``target``, reusing ``current`` when that is the cheaper way."""
        ...

    def fork(self, snapshot: Snapshot, n: int, *, task_snapshot: Snapshot) -> list[Sandbox]:
        """``n`` sandboxes at ``snapshot``."""
        ...

    def idle(self, sandbox: Sandbox) -> Sandbox | None:
        """What an environment keeps of its sandbox while it waits between episodes (None: it gave it back)."""
        ...

    def labelled(self, labels: Mapping[str, str]) -> SandboxSource:
        """This source, its new sandboxes carrying ``labels`` too (where it makes them itself)."""
        ...


def open_source(
    backend: Backend | str | None = None,
    *,
    backend_options: Mapping[str, Any] | None = None,
    pool: SandboxLeaser | None = None,
    labels: Mapping[str, str] | None = None,
) -> SandboxSource:
    """The source of ``gym.make``'s options: the pool if one is given, else the backend (default ``"local"``)."""
    if pool is not None:
        if backend is not None:
            raise ConfigError("give a backend or a pool, not both")
        return PoolSource(pool)
    return BackendSource(_open_backend(backend, backend_options), check_labels(labels))


class _Prepared:
    """Snapshots by template fingerprint: each template is built once per source."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshots: dict[str, Snapshot] = {}

    def get(self, template: Template) -> Snapshot | None:
        with self._lock:
            return self._snapshots.get(_key(template))

    def put(self, template: Template, snapshot: Snapshot) -> Snapshot:
        with self._lock:
            self._snapshots[_key(template)] = snapshot
        return snapshot


class BackendSource:
    """Sandboxes made by a backend and restored in place, carrying ``labels``."""

    def __init__(
        self, backend: Backend, labels: Mapping[str, str] | None = None, *, prepared: _Prepared | None = None
    ) -> None:
        self._backend = backend
        self.labels = dict(labels or {})
        self._prepared = prepared if prepared is not None else _Prepared()

    @property
    def name(self) -> str:
        return self._backend.name

    @property
    def description(self) -> str:
        return f"the {self._backend.name!r} backend"

    @property
    def capabilities(self) -> Capabilities:
        return self._backend.capabilities

    @property
    def backend(self) -> Backend:
        return self._backend

    def prepare(self, template: Template) -> Snapshot:
        known = self._prepared.get(template)
        return known if known is not None else self._prepared.put(template, self._backend.build(template))

    def place(self, current: Sandbox | None, target: Snapshot, *, task_snapshot: Snapshot) -> Sandbox:
        if current is not None:
            try:
                current.restore(target)
                return current
            except SandboxError:
                discard(current)
        return self._backend.create(target, labels=self.labels)

    def fork(self, snapshot: Snapshot, n: int, *, task_snapshot: Snapshot) -> list[Sandbox]:
        return list(self._backend.fork(snapshot, n, labels=self.labels))

    def idle(self, sandbox: Sandbox) -> Sandbox | None:
        return sandbox  # the next reset restores it in place

    def labelled(self, labels: Mapping[str, str]) -> BackendSource:
        merged = {**self.labels, **check_labels(labels)}
        return BackendSource(self._backend, merged, prepared=self._prepared)


class PoolSource:
    """Sandboxes leased from a SandboxPool; a reset hands the old one back."""

    def __init__(self, pool: SandboxLeaser) -> None:
        self.pool = pool
        self._capabilities: Capabilities | None = None

    @property
    def name(self) -> str:
        return "pool"

    @property
    def description(self) -> str:
        return "the pool's backend"

    @property
    def capabilities(self) -> Capabilities:
        if self._capabilities is None:
            self._capabilities = self.pool.capabilities
        return self._capabilities

    @property
    def backend(self) -> None:
        return None

    def prepare(self, template: Template) -> Snapshot:
        return self.pool.add(template)  # the pool keeps what it added

    def place(self, current: Sandbox | None, target: Snapshot, *, task_snapshot: Snapshot) -> Sandbox:
        if target.id != task_snapshot.id:
            # A checkpoint: it lives on the node where it was taken, so restore in place.
            if current is None:
                current = self.pool.acquire(task_snapshot)
            current.restore(target)
            return current
        if current is not None:
            discard(current)
        return self.pool.acquire(task_snapshot)

    def fork(self, snapshot: Snapshot, n: int, *, task_snapshot: Snapshot) -> list[Sandbox]:
        leases: list[Sandbox] = []
        try:
            for _ in range(n):
                leases.append(self.pool.acquire(task_snapshot))
                leases[-1].restore(snapshot)
        except SnapgymError:
            for lease in leases:
                discard(lease)
            raise
        return leases

    def idle(self, sandbox: Sandbox) -> Sandbox | None:
        discard(sandbox)  # the pool restores it for the next holder; an idle lease would starve others
        return None

    def labelled(self, labels: Mapping[str, str]) -> PoolSource:
        return self  # the pool's hosts label the sandboxes they make


def discard(sandbox: Sandbox) -> None:
    """Close a sandbox (or hand a lease back), ignoring errors of a dead one."""
    with contextlib.suppress(SnapgymError):
        sandbox.close()


def _key(template: Template) -> str:
    return json.dumps(template.fingerprint(), sort_keys=True, default=str)


def _open_backend(backend: Backend | str | None, options: Mapping[str, Any] | None) -> Backend:
    """The given backend, or the process's shared one of that name (default ``"local"``)."""
    if backend is None or isinstance(backend, str):
        return shared_backend(backend or DEFAULT_BACKEND, options)
    if options:
        raise ConfigError("backend_options go with a backend name, not with a backend instance")
    return backend
