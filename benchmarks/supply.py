"""Where a run's environments get their sandboxes: a backend in this process, or a Ray SandboxPool.

``direct``: one backend shared by the runner's threads; each environment
restores its sandbox in place. If the backend's daemon dies, the supply
opens a new backend, so later attempts of the lost episodes can run.
``ray``: a SandboxPool on the Ray cluster this process is connected to (or a
local Ray instance); resets lease warm sandboxes, which may live on any node.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym

from benchmarks.schemas import PoolKind
from envs.tasks import Task
from pool import Backend, PoolConfig
from pool.errors import SnapgymError
from pool.snapshots import Snapshot


class SandboxSupply:
    """Builds task snapshots and makes environments for one run.

    Args:
        kind: ``direct`` or ``ray``.
        open_backend: makes a backend (``direct``; called again if the first one dies).
        backend_options: the local backend's options for the Ray pool's hosts.
        pool_settings: the Ray pool's sizing and limits (``ray``).
    """

    def __init__(
        self,
        kind: PoolKind,
        open_backend: Callable[[], Backend],
        *,
        backend_options: Mapping[str, Any],
        pool_settings: Any,
    ) -> None:
        self.kind = kind
        self._open_backend = open_backend
        self._lock = threading.Lock()
        self._backend: Backend | None = None
        self.pool: Any = None
        if kind is PoolKind.ray:
            from pool import SandboxPool

            self.pool = SandboxPool(_pool_config(pool_settings, backend_options))
        else:
            self._backend = open_backend()

    @property
    def name(self) -> str:
        """``local`` / ``ray-pool`` and so on, for the ledger."""
        return "ray-pool" if self.pool is not None else self.backend.name

    @property
    def backend(self) -> Backend:
        """The direct backend (``direct`` only)."""
        assert self._backend is not None, "a ray supply has no direct backend"
        return self._backend

    def build(self, task: Task) -> Snapshot:
        """Build (or find) the task's snapshot."""
        if self.pool is not None:
            snapshot: Snapshot = self.pool.add(task.template)
            return snapshot
        return self.backend.build(task.template)

    def make_env(self, env_id: str, task: Task, **options: Any) -> gym.Env[Any, str]:
        """An environment for ``task`` on this supply."""
        source = {"pool": self.pool} if self.pool is not None else {"backend": self.backend}
        return gym.make(env_id, task=task, disable_env_checker=True, **source, **options)

    def recover(self) -> None:
        """After an infrastructure failure: replace a direct backend whose daemon died."""
        if self.pool is not None:
            return
        with self._lock:
            if getattr(self._backend, "daemon_has_died", False):  # a property of LocalBackend
                old, self._backend = self._backend, self._open_backend()
                with contextlib.suppress(SnapgymError):
                    assert old is not None
                    old.close()

    def stats(self) -> dict[str, Any]:
        """The Ray pool's stats (empty for ``direct``)."""
        if self.pool is None:
            return {}
        with contextlib.suppress(SnapgymError):
            stats: dict[str, Any] = self.pool.stats()
            return stats
        return {}

    def close(self) -> None:
        """Close the pool or the backend."""
        if self.pool is not None:
            self.pool.close()
        elif self._backend is not None:
            self._backend.close()


def _pool_config(settings: Any, backend_options: Mapping[str, Any]) -> PoolConfig:
    return PoolConfig(
        min_warm=settings.min_warm,
        max_warm=max(settings.min_warm, settings.max_warm),
        max_size=settings.max_size,
        lease_ttl_s=settings.lease_ttl_s,
        acquire_timeout_s=settings.acquire_timeout_s,
        max_failures=settings.max_failures,
        failure_window_s=settings.failure_window_s,
        backend_options=dict(backend_options),
    )
