"""SandboxPool across processes: a pickled pool serves Ray tasks, and leases of dead holders are reclaimed."""

from __future__ import annotations

import os

import pytest
import ray

from pool import LeaseLostError, Snapshot
from pool.cluster.lease import _renewer
from pool.cluster.sandbox_pool import SandboxPool
from tests.support.fixtures.pool_fixtures import (
    Holder,
    lease_in_task,
    slot_key,
    snapshot_stats,
    wait_until,
)

pytest_plugins = ["tests.support.fixtures.pool_fixtures"]


def test_pickled_pool_serves_a_ray_task(shared_pool: SandboxPool, base_snapshot: Snapshot) -> None:
    """A SandboxPool passed to a Ray task acquires, execs and releases there, on the same pool."""
    before = shared_pool.stats()
    result = ray.get(lease_in_task.remote(shared_pool, base_snapshot), timeout=120)
    assert result["pid"] != os.getpid()
    assert result["stdout"].startswith("hi\n")
    assert result["digest"] == base_snapshot.digest
    wait_until(lambda: shared_pool.stats()["releases"] >= before["releases"] + 1, "the task's release")
    after = shared_pool.stats()
    assert after["acquires"] >= before["acquires"] + 1
    wait_until(lambda: snapshot_stats(shared_pool, base_snapshot)["leased"] == 0, "the task's lease to be returned")


def test_lease_of_a_killed_holder_is_reclaimed_and_restored(
    single_pool: SandboxPool, single_snapshot: Snapshot
) -> None:
    """When the Ray actor holding a lease dies, the pool reclaims the sandbox after lease_ttl_s and restores it."""
    before = single_pool.stats()["reclaimed_leases"]
    holder = Holder.remote()  # type: ignore[attr-defined]
    key = tuple(ray.get(holder.take.remote(single_pool, single_snapshot), timeout=120))
    assert snapshot_stats(single_pool, single_snapshot)["leased"] == 1
    ray.kill(holder, no_restart=True)
    wait_until(lambda: single_pool.stats()["reclaimed_leases"] >= before + 1, "the pool to reclaim the lease")
    wait_until(lambda: snapshot_stats(single_pool, single_snapshot)["ready"] == 1, "the sandbox to be ready again")
    with single_pool.acquire(single_snapshot, timeout_s=30) as lease:
        assert slot_key(lease) == key
        assert lease.exec("ls /workspace").stdout == "a\nsrc\n"  # the holder's mark is gone


def test_reclaimed_lease_cannot_touch_the_next_holders_sandbox(
    single_pool: SandboxPool, single_snapshot: Snapshot
) -> None:
    """Once the pool reclaims a lease whose renewals stopped, that lease cannot reach the sandbox's next holder."""
    before = single_pool.stats()["reclaimed_leases"]
    stale = single_pool.acquire(single_snapshot)
    _renewer.unregister(stale)  # the holder still runs, but its renewals stop arriving (a long pause, a partition)
    wait_until(lambda: single_pool.stats()["reclaimed_leases"] >= before + 1, "the pool to reclaim the lease")
    with single_pool.acquire(single_snapshot, timeout_s=30) as current:
        try:
            assert slot_key(current) == slot_key(stale)
            with pytest.raises(LeaseLostError):
                stale.exec("echo intruder > /workspace/intruder")
            assert current.exec("ls /workspace").stdout == "a\nsrc\n"
        finally:
            stale.release()
            current.restore()  # leave the shared sandbox clean
