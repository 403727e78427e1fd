"""SandboxPool failures: dead host actors, dead sandboxes, failed restores, crash loops, a dead sandbox daemon."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import ray

from pool import (
    AcquireTimeoutError,
    CrashLoopError,
    LeaseLostError,
    SandboxCrashedError,
    SandboxError,
    Snapshot,
)
from pool.cluster.config import PoolConfig
from pool.cluster.lease import Lease
from pool.cluster.sandbox_pool import SandboxPool
from tests.support.fixtures.pool_fixtures import (
    host_pid,
    process_args,
    sandbox_init_pid,
    sandboxd_pids,
    settled,
    side_template,
    slot_key,
    snapshot_stats,
    wait_until,
)

pytest_plugins = ["tests.support.fixtures.pool_fixtures"]


@dataclass
class KilledHost:
    """A pool whose only host actor was killed under a held lease, after the pool replaced the host."""

    pool: SandboxPool
    snapshot: Snapshot
    lease: Lease
    error: BaseException | None
    dead_host_id: str
    dead_pid: int
    dead_daemons: list[int]
    dead_fastpath: str


@pytest.fixture(scope="module")
def killed_host(ray_cluster: None, pool_backend_options: dict[str, Any]) -> Iterator[KilledHost]:
    """Kill the host actor of a held lease with ray.kill, then wait until the pool has replaced it."""
    config = PoolConfig(min_warm=2, max_warm=4, max_size=16, tick_s=0.1,  # the lease outlives any delay of load
                        backend_options=pool_backend_options)  # fmt: skip
    pool = SandboxPool(config)
    try:
        snapshot = pool.add(side_template("hostkill"))
        pool.warm_up(snapshot, 2)
        lease = pool.acquire(snapshot)
        assert lease.exec("echo alive").stdout == "alive\n"
        wait_until(lambda: settled(pool, snapshot) and snapshot_stats(pool, snapshot)["ready"] == 2, "a full pool")
        pid = host_pid(lease)
        daemons = sandboxd_pids(pid)
        fastpath = ray.get(lease._host.ping.remote(), timeout=30)["fastpath"]
        ray.kill(lease._host, no_restart=True)
        wait_until(lambda: process_args(pid) is None, "the host actor process to exit")
        error: BaseException | None = None
        try:
            lease.exec("true")
        except BaseException as exc:
            error = exc
        wait_until(lambda: pool.stats()["host_restarts"] >= 1, "the pool to replace the dead host", timeout_s=60)
        yield KilledHost(pool, snapshot, lease, error, lease._grant.host_id, pid, daemons, fastpath)
    finally:
        pool.close()


def test_lease_on_a_killed_host_raises_lease_lost(killed_host: KilledHost) -> None:
    """Calls on a lease whose host actor died raise LeaseLostError, a SandboxCrashedError; release still works."""
    assert isinstance(killed_host.error, LeaseLostError), repr(killed_host.error)
    assert isinstance(killed_host.error, SandboxCrashedError)
    assert "acquire a new lease" in str(killed_host.error)
    with pytest.raises(LeaseLostError):
        killed_host.lease.read_file("a")
    assert not killed_host.lease.is_alive
    killed_host.lease.release()
    assert killed_host.lease.is_closed


def test_killed_host_is_counted_and_replaced(killed_host: KilledHost) -> None:
    """stats() counts the host failure and the lost lease, and lists a new live host beside the dead one."""
    assert killed_host.dead_daemons, "the host had started a sandbox daemon"
    wait_until(lambda: all(process_args(pid) is None for pid in killed_host.dead_daemons),
               "the dead host's sandbox daemon to exit")  # fmt: skip
    stats = killed_host.pool.stats()
    assert stats["host_failures"] >= 1 and stats["host_restarts"] >= 1
    assert stats["lost_leases"] >= 1
    hosts = {h["id"]: h for h in stats["hosts"]}
    assert hosts[killed_host.dead_host_id]["alive"] is False
    assert any(h["alive"] for h in hosts.values() if h["id"] != killed_host.dead_host_id)


def test_dead_hosts_fast_path_socket_is_cleaned_up(killed_host: KilledHost) -> None:
    """Once the pool has replaced a dead host, the dead host's fast-path socket and directory are gone."""
    assert killed_host.dead_fastpath
    assert not os.path.exists(os.path.dirname(killed_host.dead_fastpath))


def test_replaced_host_is_refilled_and_warm_up_counts_live_sandboxes(killed_host: KilledHost) -> None:
    """After a host is replaced, warm_up(snapshot, 2) returns only when two live sandboxes are ready."""
    ready = killed_host.pool.warm_up(killed_host.snapshot, 2, timeout_s=10)
    assert ready >= 2
    assert snapshot_stats(killed_host.pool, killed_host.snapshot)["ready"] >= 2


def test_acquire_works_after_the_host_is_replaced(killed_host: KilledHost) -> None:
    """A new acquire after a host death gets a working sandbox at the snapshot, on the new host."""
    with killed_host.pool.acquire(killed_host.snapshot, timeout_s=60) as lease:
        assert lease._grant.host_id != killed_host.dead_host_id
        assert lease.exec("cat a").stdout == "hi\n"
        assert lease.start_digest == killed_host.snapshot.digest
        assert host_pid(lease) != killed_host.dead_pid


def test_sandbox_whose_init_died_is_reported_and_restored_on_release(
    single_pool: SandboxPool, single_snapshot: Snapshot
) -> None:
    """Killing a leased sandbox's init from the host shows as SandboxCrashedError; release brings it back."""
    with single_pool.acquire(single_snapshot) as lease:
        key = slot_key(lease)
        lease.write_file("/workspace/mark", "x")
        os.kill(sandbox_init_pid(lease), signal.SIGKILL)

        def crashed() -> BaseException | None:
            try:
                lease.exec("true")
            except SandboxCrashedError as exc:
                return exc
            return None

        error = wait_until(crashed, "exec to report the dead init")
        assert not isinstance(error, LeaseLostError)  # the sandbox died; the lease is still held
    with single_pool.acquire(single_snapshot, timeout_s=30) as again:
        assert slot_key(again) == key
        assert again.exec("ls /workspace").stdout == "a\nsrc\n"
    stats = wait_until(lambda: (s := snapshot_stats(single_pool, single_snapshot))["ready"] == 1 and s, "a ready pool")
    assert stats["last_error"] is None  # the restores succeeded: nothing failed, nothing was recreated


def test_failed_restore_destroys_and_recreates_the_sandbox(shared_pool: SandboxPool) -> None:
    """A slot whose restore fails (its sandbox was destroyed on the host) is counted, dropped and replaced."""
    snapshot = shared_pool.add(side_template("restorefail"))
    shared_pool.warm_up(snapshot, 2)
    lease = shared_pool.acquire(snapshot)
    key = slot_key(lease)
    wait_until(lambda: settled(shared_pool, snapshot), "the refill after the acquire")
    before = shared_pool.stats()
    ray.get(lease._host.destroy.remote(key[1]), timeout=30)
    with pytest.raises(SandboxError, match="destroyed"):
        lease.exec("true")
    lease.release()
    wait_until(lambda: shared_pool.stats()["failures"] >= before["failures"] + 1, "the restore failure to count")
    failed = snapshot_stats(shared_pool, snapshot)
    assert "holds no sandbox" in (failed["last_error"] or "")
    assert failed["crash_looping"] is False
    assert failed["restoring"] == 0 and failed["leased"] == 0
    leases = [shared_pool.acquire(snapshot, timeout_s=30) for _ in range(3)]
    try:
        assert key not in {slot_key(held) for held in leases}
        assert all(held.exec("cat a").stdout == "hi\n" for held in leases)
        wait_until(lambda: shared_pool.stats()["recreations"] >= before["recreations"] + 1, "a recreation")
    finally:
        for held in leases:
            held.release()

    def host_agrees() -> bool:
        on_host = ray.get(lease._host.ping.remote(), timeout=30)["slots"]
        in_pool = next(h for h in shared_pool.stats()["hosts"] if h["id"] == key[0])["slots"]
        return bool(on_host == in_pool)

    wait_until(host_agrees, "the host to hold exactly the sandboxes the pool counts")


def test_restore_failures_trip_the_crash_loop_limit(make_pool: Callable[..., SandboxPool]) -> None:
    """max_failures failed restores make acquire raise CrashLoopError (with the last error), for that snapshot only."""
    pool = make_pool(min_warm=2, max_warm=4, max_size=8, max_failures=2)
    snapshot = pool.add(side_template("crashloop"))
    pool.warm_up(snapshot, 2)
    leases = [pool.acquire(snapshot, timeout_s=30) for _ in range(2)]
    wait_until(lambda: settled(pool, snapshot), "the refill after the acquires")
    for lease in leases:
        ray.get(lease._host.destroy.remote(slot_key(lease)[1]), timeout=30)
        lease.release()
    wait_until(lambda: snapshot_stats(pool, snapshot)["crash_looping"], "the crash-loop limit to trip")
    with pytest.raises(CrashLoopError, match=rf"{snapshot.id} failed 2 times.*holds no sandbox"):
        pool.acquire(snapshot, timeout_s=5)
    assert pool.stats()["failures"] >= 2
    other = pool.add(side_template("crashloop-neighbour"))
    with pool.acquire(other, timeout_s=30) as lease:
        assert lease.exec("cat a").stdout == "hi\n"


def test_pool_recovers_when_a_hosts_sandbox_daemon_dies(make_pool: Callable[..., SandboxPool]) -> None:
    """After the sandbox daemon of a host is killed, the pool recovers: acquires soon give working sandboxes."""
    pool = make_pool(min_warm=2, max_warm=4, max_size=8)
    snapshot = pool.add(side_template("daemonkill"))
    pool.warm_up(snapshot, 2)
    with pool.acquire(snapshot) as lease:
        daemons = sandboxd_pids(host_pid(lease))
    assert daemons
    for pid in daemons:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(process_args(pid) is None for pid in daemons), "the daemon to exit")

    def recovered() -> bool:
        try:
            with pool.acquire(snapshot, timeout_s=2) as lease:
                return lease.exec("echo ok").stdout == "ok\n"
        except CrashLoopError as exc:  # a dead daemon is the host's failure, not the snapshot's
            pytest.fail(f"the snapshot was declared crash-looping: {exc}")
        except (SandboxError, AcquireTimeoutError):
            return False

    wait_until(recovered, "a working sandbox after the daemon died", timeout_s=15, every_s=0.2)
