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
bumps :attr:`SandboxSupply.generation`, so the runner drops environments made
on the old backend or pool.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym

from benchmarks.schemas import PoolKind
from envs.tasks import Task
from pool import Backend, Capabilities, PoolConfig
from pool.errors import PoolError
from pool.snapshots import Snapshot
from pool.templates import Template

log = logging.getLogger(__name__)
_CLOSE_DEAD_POOL_S = 5.0
"""How long closing a pool whose manager is gone may take (its actors are killed either way)."""


class SandboxSupply:
    """Builds task snapshots and makes environments for one run.

    Args:
        kind: ``direct`` or ``ray``.
        open_backend: makes a backend (``direct``; called again if the first one dies).
        backend_options: the backend's options for the Ray pool's hosts.
        backend_name: the backend the Ray pool's hosts run.
        pool_settings: the Ray pool's sizing and limits (``ray``).
    """

    def __init__(
        self,
        kind: PoolKind,
        open_backend: Callable[[], Backend],
        *,
        backend_options: Mapping[str, Any],
        pool_settings: Any,
        backend_name: str = "local",
    ) -> None:
        self.kind = kind
        self._open_backend = open_backend
        self._lock = threading.RLock()
        self._backend: Backend | None = None
        self._templates: dict[str, Template] = {}
        self.generation = 0
        """Bumped each time the backend or pool is replaced."""
        self.pool: Any = None
        if kind is PoolKind.ray:
            self._pool_config = _pool_config(pool_settings, backend_name, backend_options)
            self.pool = self._open_pool()
        else:
            self._backend = open_backend()

    @property
    def name(self) -> str:
        """``local`` / ``ray-pool`` and so on, for the ledger."""
        return "ray-pool" if self.kind is PoolKind.ray else self.backend.name

    @property
    def health_name(self) -> str:
        """For outage messages."""
        return "the sandbox pool" if self.kind is PoolKind.ray else "the sandbox backend"

    @property
    def backend(self) -> Backend:
        """The direct backend (``direct`` only)."""
        assert self._backend is not None, "a ray supply has no direct backend"
        return self._backend

    def build(self, task: Task) -> Snapshot:
        """Build (or find) the task's snapshot."""
        if self.pool is None:
            return self.backend.build(task.template)
        with self._lock:
            pool = self.pool
        snapshot: Snapshot = pool.add(task.template)
        with self._lock:
            self._templates[snapshot.id] = task.template
        return snapshot

    def for_task(self, task: Task) -> SandboxSupply:
        """The supply that serves ``task``: this one (see benchmarks.episodes.routing for a run over two)."""
        return self

    def make_env(self, env_id: str, task: Task, **options: Any) -> gym.Env[Any, str]:
        """An environment for ``task`` on this supply."""
        with self._lock:
            source = {"pool": self.pool} if self.pool is not None else {"backend": self.backend}
        return gym.make(env_id, task=task, disable_env_checker=True, **source, **options)

    @property
    def capabilities(self) -> Capabilities:
        """What the run's backend does (the pool's backend for ``ray``)."""
        with self._lock:
            source = self.pool if self.pool is not None else self.backend
        capabilities: Capabilities = source.capabilities
        return capabilities

    def check_health(self) -> str | None:
        """None when the supply can give sandboxes now; otherwise why not (see the module docstring)."""
        with self._lock:
            if self.pool is None:
                return self._replace_dead_backend()
            pool = self.pool
        try:
            reason: str | None = pool.health()
        except PoolError as exc:
            return str(exc)
        return reason

    def recover(self) -> None:
        """Replace a backend that stopped serving, or a pool whose manager is gone. Never raises."""
        with self._lock:
            if self.pool is None:
                self._replace_dead_backend()
                return
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
        """The Ray pool's stats (empty for ``direct``, or when the pool does not answer)."""
        if self.pool is None:
            return {}
        with contextlib.suppress(Exception):
            stats: dict[str, Any] = self.pool.stats()
            return stats
        return {}

    def keep_run_checkpoints(self) -> None:
        """Ask the backend to leave the run's checkpoints when it closes, for the run's resume to go on from.

        Only a backend whose checkpoints would go with it offers that (Docker's ``keep_run_checkpoints``;
        the local backend's stay in its store anyway). A Ray pool's hosts close their own backends.
        """
        keep = getattr(self._backend, "keep_run_checkpoints", None)
        if self.pool is None and keep is not None:
            kept = keep()
            if kept:
                log.info("%d checkpoint(s) of this run stay in the %s backend for its resume", kept, self.name)

    def close(self) -> None:
        """Close the pool or the backend."""
        if self.pool is not None:
            self.pool.close()
        elif self._backend is not None:
            self._backend.close()

    # -- replacing what died ----------------------------------------------------

    def _replace_dead_backend(self) -> str | None:
        assert self._backend is not None
        reason = self._backend.health
        if reason is None:
            return None
        try:
            new = self._open_backend()
        except Exception as exc:
            return f"the backend cannot serve ({reason}) and no new one could be opened ({type(exc).__name__}: {exc})"
        old, self._backend = self._backend, new
        self.generation += 1
        with contextlib.suppress(Exception):
            assert old is not None
            old.close()
        return None

    def _replace_pool(self) -> None:
        new = self._open_pool()
        try:
            for template in self._templates.values():
                new.add(template)
        except BaseException:
            with contextlib.suppress(Exception):
                new.close(timeout_s=_CLOSE_DEAD_POOL_S)
            raise
        old, self.pool = self.pool, new
        self.generation += 1
        with contextlib.suppress(Exception):
            old.close(timeout_s=_CLOSE_DEAD_POOL_S)
        log.warning("a new sandbox pool serves the run (%d task snapshot(s) added again)", len(self._templates))

    def _open_pool(self) -> Any:
        from pool import SandboxPool

        return SandboxPool(self._pool_config)


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
