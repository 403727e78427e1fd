"""SandboxPool.close(): every sandbox, daemon and actor goes away; the pool refuses further use."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray

from pool import PoolClosedError, PoolError, SandboxError, Snapshot, Template
from pool.cluster.config import PoolConfig
from pool.cluster.lease import Lease
from pool.cluster.sandbox_pool import SandboxPool
from tests.support.fixtures.pool_fixtures import (
    descendants,
    host_pid,
    lease_in_task,
    manager_pid,
    process_args,
    side_template,
    wait_until,
)

pytest_plugins = ["tests.support.fixtures.pool_fixtures"]


@dataclass
class ClosedPool:
    """A pool closed while it held a lease, with what it ran and made before."""

    pool: SandboxPool
    template: Template
    snapshot: Snapshot
    lease: Lease
    processes: dict[str, list[int]]
    sockets: list[str]
    run_dirs: list[Path]


@pytest.fixture(scope="module")
def closed_pool(ray_cluster: None, pool_backend_options: dict[str, Any]) -> ClosedPool:
    """A pool with two warm sandboxes and a lease running a background process, then closed."""
    config = PoolConfig(min_warm=2, max_warm=4, max_size=8, lease_ttl_s=2, tick_s=0.1,
                        backend_options=pool_backend_options)  # fmt: skip
    pool = SandboxPool(config)
    template = side_template("close")
    try:
        snapshot = pool.add(template)
        pool.warm_up(snapshot, 2)
        lease = pool.acquire(snapshot)
        assert lease.exec("sleep 300 >/dev/null 2>&1 & echo started").stdout == "started\n"
        host = host_pid(lease)
        assert "SandboxHost" in (process_args(host) or "")
        assert "PoolManager" in (process_args(manager_pid(pool)) or "")
        assert any("sandboxd" in (process_args(pid) or "") for pid in descendants(host))
        processes = {"host": [host], "manager": [manager_pid(pool)], "below the host": descendants(host)}
        sockets = [pool._fastpath_path, ray.get(lease._host.ping.remote(), timeout=30)["fastpath"]]
        run_dirs = list(Path("/run/snapgym").glob(f"{host}-*")) if os.geteuid() == 0 else []
    finally:
        pool.close()
    return ClosedPool(pool, template, snapshot, lease, processes, sockets, run_dirs)


def test_close_ends_every_process_of_the_pool(closed_pool: ClosedPool) -> None:
    """close() ends the manager, the host actor, its daemon and every sandbox process, and removes its sockets."""
    processes = closed_pool.processes
    below = processes["below the host"]
    assert len(below) >= 4  # a daemon and the processes of three sandboxes at least
    everything = [pid for pids in processes.values() for pid in pids]
    wait_until(lambda: all(process_args(pid) is None for pid in everything), "every process of the pool to exit")
    assert not [path for path in closed_pool.sockets if os.path.exists(path)]
    assert not [path for path in closed_pool.run_dirs if path.exists()]


def test_closed_pool_refuses_use_and_close_is_idempotent(closed_pool: ClosedPool) -> None:
    """After close(), acquire/add/stats raise PoolClosedError, close() is a no-op, a held lease is unusable."""
    pool = closed_pool.pool
    with pytest.raises(PoolClosedError, match="create a new SandboxPool"):
        pool.acquire(closed_pool.snapshot)
    with pytest.raises(PoolClosedError):
        pool.add(closed_pool.template)
    with pytest.raises(PoolClosedError):
        pool.stats()
    pool.close()
    pool.close()
    with pytest.raises(SandboxError):  # the lease's host is gone
        closed_pool.lease.exec("true")
    closed_pool.lease.release()
    assert closed_pool.lease.is_closed


def test_warm_up_after_close_raises_pool_closed(closed_pool: ClosedPool) -> None:
    """warm_up on a closed pool raises PoolClosedError like acquire, add and stats."""
    with pytest.raises(PoolClosedError):
        closed_pool.pool.warm_up(closed_pool.snapshot, 1, timeout_s=5)


def test_copy_of_a_closed_pool_raises_a_pool_error(closed_pool: ClosedPool) -> None:
    """A pool passed to a Ray task after close() raises a PoolError there, not a Ray internal error."""
    with pytest.raises(ray.exceptions.RayTaskError) as raised:
        ray.get(lease_in_task.remote(closed_pool.pool, closed_pool.snapshot), timeout=120)
    assert isinstance(raised.value.as_instanceof_cause(), PoolError), raised.value
