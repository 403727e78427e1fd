"""SandboxPool sizing: the warm target grows under demand, max_size bounds it, idleness shrinks it back."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

import pytest
import ray

from pool import AcquireTimeoutError, PoolError
from pool.cluster.lease import Lease
from pool.cluster.sandbox_pool import SandboxPool
from tests.support.fixtures.pool_fixtures import process_args, settled, side_template, snapshot_stats, wait_until

pytest_plugins = ["tests.support.fixtures.pool_fixtures"]


def test_demand_grows_the_pool_up_to_max_size_then_idleness_shrinks_it(make_pool: Callable[..., SandboxPool]) -> None:
    """Extra acquires wait, grow the warm target, succeed; past max_size they time out; idleness shrinks it back."""
    pool = make_pool(min_warm=1, max_warm=4, max_size=3, idle_s=1.0)
    snapshot = pool.add(side_template("demand"))
    assert pool.warm_up(snapshot, 1) >= 1
    wait_until(lambda: settled(pool, snapshot), "the first sandbox")
    assert snapshot_stats(pool, snapshot)["warm_target"] == 1
    handle = ray.get(pool._manager.host_info.remote(pool.stats()["hosts"][0]["id"]), timeout=30)[0]
    host = int(ray.get(handle.ping.remote(), timeout=30)["pid"])
    assert "SandboxHost" in (process_args(host) or "")

    leases: list[Lease] = []
    errors: list[BaseException] = []

    def take() -> None:
        try:
            leases.append(pool.acquire(snapshot, timeout_s=60))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=take) for _ in range(3)]
    os.kill(host, signal.SIGSTOP)  # no new sandbox can be made until SIGCONT: the extra acquires must wait
    try:
        for thread in threads:
            thread.start()
        wait_until(lambda: len(leases) == 1, "the ready sandbox to be leased")
        grown = wait_until(lambda: (s := snapshot_stats(pool, snapshot))["warm_target"] > 1 and s,
                           "the waiting acquires to raise the warm target")  # fmt: skip
        assert len(leases) == 1 and not errors  # the other two are still waiting
        assert grown["leased"] == 1 and grown["ready"] == 0
    finally:
        os.kill(host, signal.SIGCONT)
    for thread in threads:
        thread.join()
    try:
        assert not errors, errors
        assert len({lease.lease_id for lease in leases}) == 3
        assert all(lease.exec("cat a").stdout == "hi\n" for lease in leases)
        stats = pool.stats()
        assert stats["snapshots"][snapshot.id]["leased"] == 3
        assert sum(stats["slots"].values()) + stats["creating"] <= 3  # never past max_size
        assert stats["acquire_wait_ms"]["n"] >= 3

        with pytest.raises(AcquireTimeoutError, match=snapshot.id) as timeout:
            pool.acquire(snapshot, timeout_s=1)
        assert isinstance(timeout.value, TimeoutError) and isinstance(timeout.value, PoolError)
        assert "max_size" in str(timeout.value)
    finally:
        for lease in leases:
            lease.release()

    idle = wait_until(
        lambda: (s := snapshot_stats(pool, snapshot))["warm_target"] == 1 and s["ready"] == 1 and s,
        "the warm target and the ready sandboxes to shrink back to min_warm",
    )
    assert idle["leased"] == 0 and idle["restoring"] == 0
    with pool.acquire(snapshot, timeout_s=30) as lease:  # still serving after the shrink
        assert lease.exec("cat a").stdout == "hi\n"


def test_steady_load_keeps_its_sandboxes_instead_of_churning(make_pool: Callable[..., SandboxPool]) -> None:
    """Episodes that release and acquire again at once, for several idle_s: the slots they release come back
    after their restore, so the pool neither destroys ready sandboxes an acquire is about to need nor opens
    new ones in their place (each costs a sandbox build). The same few sandboxes serve every lease."""
    import time

    pool = make_pool(min_warm=1, max_warm=4, max_size=8, idle_s=1.0)
    snapshot = pool.add(side_template("steady"))
    assert pool.warm_up(snapshot, 1) >= 1
    used: set[str] = set()
    errors: list[BaseException] = []
    stop = time.monotonic() + 5.0

    def episodes() -> None:
        try:
            while time.monotonic() < stop:
                with pool.acquire(snapshot, timeout_s=30) as lease:
                    used.add(lease.id)
                    lease.exec("true")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=episodes) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(used) <= 3 + 4, f"{len(used)} sandboxes served 3 steady workers: the pool churned"
