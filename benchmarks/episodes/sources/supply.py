"""Where a run's environments get their sandboxes: a backend in this process, or a Ray SandboxPool.

``direct``: one backend shared by the runner's threads; each environment
restores its sandbox in place. If the backend stops serving (``backend.health``:
the local backend's daemon died, the Docker engine is gone), the supply opens a
new backend, so later attempts of the lost episodes can run.
``ray``: a SandboxPool on the Ray cluster this process is connected to (or a
local Ray instance); resets lease warm sandboxes, which may live on any node.

The supply is the runner's :class:`benchmarks.episodes.outage.HealthProbe` for
sandboxes. It serves when its backend is healthy (or a new backend could be
opened in its place: a backend that can be replaced is an ordinary failure
of the attempts it broke), or when the pool's manager answers and has a live
host. Its ``recover()`` replaces a pool whose manager is gone with a new one
(the same config, every task snapshot added again; snapshot ids are content
hashes, so they do not change). The manager actor is not restarted by Ray
(``max_restarts``) because a restarted manager would come back empty (no
hosts, no served snapshots, a new fast-path socket) behind handles that look
the same; a new pool is the same work, done in the open. Each replacement
bumps the supply's ``generation``, so the runner drops environments made
on the old backend or pool.

Which of the two serves a run is decided once (:func:`open_sandbox_supply`); each hands its
environments a typed :class:`envs.episode.sources.SandboxSource`, so neither the runner nor the
environment asks again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from benchmarks.episodes.outage import FIRST_CONTACT_S, UnreachableError
from benchmarks.schemas import PoolKind
from envs.episode.sources import BackendSource, PoolSource, SandboxSource
from envs.tasks import Task
from pool import Backend, Capabilities, PoolConfig
from pool.contract import KeepsRunCheckpoints
from pool.errors import PoolError
from pool.snapshots import Snapshot
from pool.templates import Template

if TYPE_CHECKING:
    from pool.cluster.sandbox_pool import SandboxPool

log = logging.getLogger(__name__)
_CLOSE_DEAD_POOL_S = 5.0
"""How long closing a pool whose manager is gone may take (its actors are killed either way)."""


class BackendSupply:
    """A run's sandboxes from one backend in this process, shared by the runner's threads.

    Args:
        open_backend: makes the backend (called again if the first one stops serving).
    """

    kind = PoolKind.direct
    health_name = "the sandbox backend"
    """For outage messages."""

    def __init__(self, open_backend: Callable[[], Backend]) -> None:
        self._open_backend = open_backend
        self._lock = threading.RLock()
        self.backend = open_backend()
        self.source: SandboxSource = BackendSource(self.backend)
        """What the run's environments get their sandboxes from (a new one when the backend is replaced)."""
        self.generation = 0
        """Bumped each time the backend is replaced."""

    @property
    def name(self) -> str:
        """The backend's name, for the ledger."""
        return self.backend.name

    @property
    def capabilities(self) -> Capabilities:
        """What the run's backend does."""
        return self.backend.capabilities

    def for_task(self, task: Task) -> BackendSupply:
        """The supply that serves ``task``: this one (see benchmarks.episodes.sources.routing for a run over two)."""
        return self

    @property
    def current_source(self) -> SandboxSource:
        """``source``, read under the lock that its replacement holds."""
        with self._lock:
            return self.source

    def build(self, task: Task) -> Snapshot:
        """Build (or find) the task's snapshot (its environments find it prepared)."""
        return self.current_source.prepare(task.template)

    def make_env(self, env_id: str, task: Task, **options: Any) -> gym.Env[Any, str]:
        """An environment for ``task`` on this supply."""
        return _make_env(self.current_source, env_id, task, options)

    @property
    def health_hint(self) -> str:
        """What to check when the backend never served."""
        return f"is the {self.name} backend's service running and reachable (backend={self.name} and its options)?"

    def check_health(self) -> str | None:
        """None when the backend serves, or a new one could be opened in its place; otherwise why not."""
        with self._lock:
            return self._replace_dead_backend()

    def recover(self) -> None:
        """Replace a backend that stopped serving. Never raises."""
        with self._lock:
            self._replace_dead_backend()

    def stats(self) -> dict[str, Any]:
        """Nothing: a backend in this process keeps no pool statistics."""
        return {}

    def keep_run_checkpoints(self) -> None:
        """Ask the backend to leave the run's checkpoints when it closes, for the run's resume to go on from.

        Only a backend whose checkpoints would go with it offers that (Docker's ``keep_run_checkpoints``;
        the local backend's stay in its store anyway).
        """
        if isinstance(self.backend, KeepsRunCheckpoints):
            kept = self.backend.keep_run_checkpoints()
            if kept:
                log.info("%d checkpoint(s) of this run stay in the %s backend for its resume", kept, self.name)

    def close(self) -> None:
        """Close the backend."""
        self.backend.close()

    def _replace_dead_backend(self) -> str | None:
        reason = self.backend.health
        if reason is None:
            return None
        try:
            new = self._open_backend()
        except Exception as exc:
            return f"the backend cannot serve ({reason}) and no new one could be opened ({type(exc).__name__}: {exc})"
        old, self.backend, self.source = self.backend, new, BackendSource(new)
        self.generation += 1
        with contextlib.suppress(Exception):
            old.close()
        return None


class PoolSupply:
    """A run's sandboxes leased from a Ray SandboxPool (on the cluster this process is connected to).

    Args:
        pool_settings: the pool's sizing and limits.
        backend_name: the backend the pool's hosts run.
        backend_options: that backend's options.
    """

    kind = PoolKind.ray
    health_name = "the sandbox pool"
    """For outage messages."""
    name = "ray-pool"
    """For the ledger."""

    def __init__(self, pool_settings: Any, *, backend_name: str = "local",
                 backend_options: Mapping[str, Any] | None = None) -> None:  # fmt: skip
        self._lock = threading.RLock()
        self._config = _pool_config(pool_settings, backend_name, backend_options or {})
        self._templates: dict[str, Template] = {}
        self.pool = _open_pool(self._config)
        self.source: SandboxSource = PoolSource(self.pool)
        """What the run's environments get their sandboxes from (a new one when the pool is replaced)."""
        self.generation = 0
        """Bumped each time the pool is replaced."""

    @property
    def current_source(self) -> SandboxSource:
        """``source``, read under the lock that its replacement holds."""
        with self._lock:
            return self.source

    @property
    def capabilities(self) -> Capabilities:
        """What the pool's backend does."""
        return self.current_source.capabilities

    def for_task(self, task: Task) -> PoolSupply:
        """The supply that serves ``task``: this one (see benchmarks.episodes.sources.routing for a run over two)."""
        return self

    def build(self, task: Task) -> Snapshot:
        """Build (or find) the task's snapshot on the pool's hosts, and keep warm sandboxes of it."""
        snapshot = self.current_source.prepare(task.template)
        with self._lock:
            self._templates[snapshot.id] = task.template
        return snapshot

    def make_env(self, env_id: str, task: Task, **options: Any) -> gym.Env[Any, str]:
        """An environment for ``task`` on this supply."""
        return _make_env(self.current_source, env_id, task, options)

    health_hint = "is the Ray cluster up with at least one live node (ray status), and RAY_ADDRESS its address?"
    """What to check when the pool never served."""

    def check_health(self) -> str | None:
        """None when the pool's manager answers and has a live host; otherwise why not."""
        with self._lock:
            pool = self.pool
        try:
            return pool.health()
        except PoolError as exc:
            return str(exc)

    def recover(self) -> None:
        """Replace a pool whose manager is gone. Never raises."""
        with self._lock:
            try:
                self.pool.health()
                return  # the manager answers: it replaces dead hosts and adopts new nodes itself
            except PoolError as exc:
                log.warning("re-creating the sandbox pool: %s", exc)
            try:
                self._replace_pool()
            except Exception as exc:
                log.warning("the sandbox pool could not be re-created yet: %s: %s", type(exc).__name__, exc)

    def stats(self) -> dict[str, Any]:
        """The pool's stats (empty when the pool does not answer)."""
        with contextlib.suppress(Exception):
            return self.pool.stats()
        return {}

    def keep_run_checkpoints(self) -> None:
        """Nothing to do: the pool's hosts close their own backends."""

    def close(self) -> None:
        """Close the pool."""
        self.pool.close()

    def _replace_pool(self) -> None:
        new = _open_pool(self._config)
        try:
            for template in self._templates.values():
                new.add(template)
        except BaseException:
            with contextlib.suppress(Exception):
                new.close(timeout_s=_CLOSE_DEAD_POOL_S)
            raise
        old, self.pool, self.source = self.pool, new, PoolSource(new)
        self.generation += 1
        with contextlib.suppress(Exception):
            old.close(timeout_s=_CLOSE_DEAD_POOL_S)
        log.warning("a new sandbox pool serves the run (%d task snapshot(s) added again)", len(self._templates))


SandboxSupply = BackendSupply | PoolSupply
"""Where one backend's sandboxes come from for a run."""


def open_sandbox_supply(
    kind: PoolKind,
    open_backend: Callable[[], Backend],
    *,
    backend_options: Mapping[str, Any],
    pool_settings: Any,
    backend_name: str = "local",
) -> SandboxSupply:
    """The run's one choice: ``direct`` (a backend here) or ``ray`` (a SandboxPool of ``backend_name``)."""
    if kind is PoolKind.ray:
        return PoolSupply(pool_settings, backend_name=backend_name, backend_options=backend_options)
    return BackendSupply(open_backend)


def _make_env(source: SandboxSource, env_id: str, task: Task, options: Mapping[str, Any]) -> gym.Env[Any, str]:
    """An environment ``env_id`` for ``task`` whose sandboxes come from ``source`` (``options``: its own)."""
    return gym.make(env_id, task=task, disable_env_checker=True, source=source, **options)


def _open_pool(config: PoolConfig) -> SandboxPool:
    import ray

    from pool.cluster.sandbox_pool import SandboxPool  # Ray is imported only by a run that uses it

    if not ray.is_initialized():
        reach_ray_cluster(os.environ.get("RAY_ADDRESS", ""))
    return SandboxPool(config)


def reach_ray_cluster(address: str, *, within_s: float = FIRST_CONTACT_S) -> None:
    """Return once the cluster at ``address`` (``RAY_ADDRESS``: ``host:port`` or ``ray://host:port``) accepts a
    connection, retrying for ``within_s``; nothing to check for no address, ``auto`` or ``local``.

    ``ray.init`` itself waits for an address that never answers without end, in silence.

    Raises:
        UnreachableError: nothing answered there, naming the address and what to check.
    """
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    began, pause = time.monotonic(), 0.5
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=min(5.0, within_s)):
                return
        except OSError as exc:
            lasted = time.monotonic() - began
            if lasted + pause > within_s:
                raise UnreachableError(
                    f"the Ray cluster at RAY_ADDRESS={address} never answered since the run started (tried for "
                    f"{lasted:.0f} s: {exc}); is the cluster running (ray status), and is RAY_ADDRESS its head's "
                    "address (host:6379, or ray://host:10001)? Unset it to start Ray on this machine"
                ) from None
        time.sleep(pause)
        pause = min(pause * 2, 4.0)


def _pool_config(settings: Any, backend: str, backend_options: Mapping[str, Any]) -> PoolConfig:
    return PoolConfig(
        min_warm=settings.min_warm,
        max_warm=max(settings.min_warm, settings.max_warm),
        max_size=settings.max_size,
        lease_ttl_s=settings.lease_ttl_s,
        acquire_timeout_s=settings.acquire_timeout_s,
        max_failures=settings.max_failures,
        failure_window_s=settings.failure_window_s,
        backend=backend,
        backend_options=dict(backend_options),
    )
