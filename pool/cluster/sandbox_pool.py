"""SandboxPool: warm sandboxes on a Ray cluster, handed out as leases.

>>> pool = SandboxPool(PoolConfig(min_warm=4))
>>> snapshot = pool.add(Template(name="demo", setup=["echo hi > a"], workdir="/w"))
>>> with pool.acquire(snapshot) as lease:      # a ready sandbox, at once
...     lease.exec("cat a").stdout
'hi\\n'
>>> pool.stats()["slots"]                       # {'ready': 4, 'leased': 0, 'restoring': 1, ...}
>>> pool.close()

The pool is a handle on a manager actor; it pickles, so Ray tasks and actors
can acquire leases from the same pool. Host actors (one per node that offers
the ``snapgym_host`` resource, or every node when none does) hold the
sandboxes. Closing the pool, or the exit of the driver that made it, destroys
every sandbox and actor.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

from pool.backends import backend_factory as make_backend_factory
from pool.capabilities import Capabilities
from pool.cluster.calls import raycalls
from pool.cluster.calls.fastpath import FastPathClient, reachable
from pool.cluster.config import PoolConfig
from pool.cluster.host import BackendFactory
from pool.cluster.lease import Lease
from pool.cluster.manager import PoolManager
from pool.errors import ConfigError, PoolClosedError
from pool.snapshots import Snapshot
from pool.templates import Template


class SandboxPool:
    """A pool of pre-warmed sandboxes managed by Ray actors.

    Args:
        config: sizes, timeouts and failure limits, and the backend (see PoolConfig).
        backend: the backend by name; given, it replaces ``config.backend``.
        backend_options: its options; given, they replace ``config.backend_options``. Options
            that depend on the process (the local backend's store folder) are settled here, in
            the driver, so every node's backend is configured alike.
        backend_factory: makes each host's backend instead (for tests and custom backends).
        ray_address: the cluster to join when Ray is not initialised yet
            (default: ``RAY_ADDRESS``, a local cluster started with ``ray start``, or a new local one).
    """

    def __init__(
        self,
        config: PoolConfig | None = None,
        *,
        backend: str | None = None,
        backend_options: Mapping[str, Any] | None = None,
        backend_factory: BackendFactory | None = None,
        ray_address: str | None = None,
    ) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.config = config or PoolConfig()
        if not isinstance(self.config, PoolConfig):
            raise ConfigError(f"config must be a PoolConfig, got {type(self.config).__name__}")
        if backend is not None or backend_options is not None:
            self.config = dataclasses.replace(
                self.config,
                backend=backend if backend is not None else self.config.backend,
                backend_options=dict(backend_options if backend_options is not None else self.config.backend_options),
            )
        factory = backend_factory or make_backend_factory(self.config.backend, self.config.backend_options)
        if not ray.is_initialized():
            ray.init(address=ray_address, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
        manager_class = raycalls.actor_class(PoolManager, num_cpus=0, max_concurrency=1024, max_restarts=0)
        # On the driver's node, so the driver reaches the manager through the same-node fast path.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._manager = manager_class.options(scheduling_strategy=here).remote(self.config, factory)
        self._fastpath_path: str = raycalls.get(self._manager.fastpath.remote())
        self._init_caches()

    def _init_caches(self) -> None:
        self._closed = False
        self._hosts: dict[str, tuple[Any, FastPathClient | None]] = {}
        self._snapshots: dict[str, Snapshot] = {}
        self._added: dict[str, Snapshot] = {}
        self._identities: dict[tuple[str, int], tuple[str, dict[str, str]]] = {}
        """Each slot's sandbox id and labels: a slot number is never reused on its host."""
        self._manager_fast = FastPathClient(self._fastpath_path) if reachable(self._fastpath_path) else None
        self._capabilities: Capabilities | None = None

    @classmethod
    def _attach(cls, manager: Any, config: PoolConfig, fastpath_path: str) -> SandboxPool:
        pool = cls.__new__(cls)
        pool.config = config
        pool._manager = manager
        pool._fastpath_path = fastpath_path
        pool._init_caches()
        return pool

    def __reduce__(self) -> tuple[Any, ...]:
        return (SandboxPool._attach, (self._manager, self.config, self._fastpath_path))

    def add(self, template: Template) -> Snapshot:
        """Build a template on every host (cached) and keep warm sandboxes of it."""

        self._check_open()
        key = json.dumps(template.fingerprint(), sort_keys=True)
        if key in self._added:  # many environments of one task share one build round trip
            return self._added[key]
        snapshot: Snapshot = self._manager_get(self._manager.add.remote(template))
        self._snapshots[snapshot.id] = snapshot
        self._added[key] = snapshot
        return snapshot

    def acquire(self, snapshot: Snapshot | str, *, timeout_s: float | None = None) -> Lease:
        """A ready sandbox at ``snapshot``, as a lease (release it, or use ``with``).

        Raises:
            AcquireTimeoutError: none became ready within the timeout.
            CrashLoopError: the snapshot's sandboxes keep failing.
        """
        self._check_open()
        snapshot_id = snapshot.id if isinstance(snapshot, Snapshot) else snapshot
        gone = "the pool's manager is gone (the pool was closed, its driver exited, or it died)"
        try:
            if self._manager_fast is not None:
                grant = self._manager_fast.call("acquire", snapshot_id, timeout_s, _holder())
            else:
                grant = self._manager_get(self._manager.acquire.remote(snapshot_id, timeout_s, _holder()))
        except ConnectionError:
            raise PoolClosedError(gone) from None
        host = self._hosts.get(grant.host_id)
        if host is None:
            handle, fastpath = self._manager_get(self._manager.host_info.remote(grant.host_id))
            host = self._hosts[grant.host_id] = (handle, FastPathClient(fastpath) if reachable(fastpath) else None)
        start = self._snapshots.get(grant.snapshot_id)
        if start is None:
            start = self._manager_get(self._manager.snapshot.remote(grant.snapshot_id))
            self._snapshots[grant.snapshot_id] = start
        lease = Lease(self._manager, grant, host[0], start, host_fast=host[1], manager_fast=self._manager_fast,
                      identities=self._identities)  # fmt: skip
        return lease

    def release(self, lease: Lease) -> None:
        """Give a lease back (same as ``lease.release()``)."""
        lease.release()

    def warm_up(self, snapshot: Snapshot, n: int, *, timeout_s: float = 120.0) -> int:
        """Wait until ``n`` sandboxes of ``snapshot`` are ready; returns how many are."""
        self._check_open()
        ready: int = self._manager_get(self._manager.wait_ready.remote(snapshot.id, n, timeout_s))
        return ready

    def stats(self) -> dict[str, Any]:
        """Slots by state, acquire wait and restore percentiles, failures, recreations, hosts."""
        self._check_open()
        stats: dict[str, Any] = self._manager_get(self._manager.stats.remote())
        return stats

    def health(self, *, timeout_s: float = 10.0) -> str | None:
        """None when the pool can hand out sandboxes; otherwise why not (its manager has no live host).

        Raises:
            PoolClosedError: the pool was closed, or its manager is gone or does not answer in ``timeout_s``.
        """
        self._check_open()
        reason: str | None = self._manager_get(self._manager.health.remote(), timeout_s=timeout_s)
        return reason

    @property
    def capabilities(self) -> Capabilities:
        """What the pool's backend does (asked of a host once, then kept)."""
        self._check_open()
        if self._capabilities is None:
            self._capabilities = self._manager_get(self._manager.capabilities.remote())
        return self._capabilities

    def machine_memory(self) -> dict[str, int]:
        """Bytes of memory in use on each machine that hosts the pool's sandboxes (by kernel boot id)."""
        self._check_open()
        memory: dict[str, int] = raycalls.get(self._manager.machine_memory.remote())
        return memory

    def close(self, *, timeout_s: float = 120.0) -> None:
        """Destroy every sandbox and actor of the pool. Idempotent.

        Args:
            timeout_s: how long the manager may take to close its hosts; then it is killed
                (Ray kills the hosts it owns with it).
        """
        import ray

        if self._closed:
            return
        self._closed = True
        try:
            ray.get(self._manager.close.remote(), timeout=timeout_s)
        finally:
            ray.kill(self._manager, no_restart=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("the pool is closed; create a new SandboxPool")

    def _manager_get(self, ref: Any, *, timeout_s: float | None = None) -> Any:
        """A manager call's value; a manager that is gone or silent raises PoolClosedError, not a Ray error."""
        from ray.exceptions import GetTimeoutError, RayActorError, RaySystemError

        try:
            return raycalls.get(ref, timeout_s=timeout_s)
        except RayActorError as exc:
            raise PoolClosedError(f"the pool's manager is gone ({type(exc).__name__})") from None
        except GetTimeoutError:
            raise PoolClosedError(f"the pool's manager did not answer within {timeout_s:g} s") from None
        except RaySystemError as exc:
            first = (str(exc).splitlines() or [""])[0]
            raise PoolClosedError(f"Ray is out of reach ({type(exc).__name__}: {first})") from None


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
