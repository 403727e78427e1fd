"""SandboxPool basics: leases are sandboxes, releases restore, mid-lease snapshots, stats, warm-up, errors."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import pool
from pool import (
    ConfigError,
    ExecResult,
    PoolError,
    SandboxClosedError,
    SandboxError,
    Snapshot,
)
from pool.cluster.config import PoolConfig
from pool.cluster.sandbox_pool import SandboxPool
from tests.support.fixtures.pool_fixtures import (
    settled,
    side_template,
    slot_key,
    snapshot_stats,
    wait_until,
)

pytest_plugins = ["tests.support.fixtures.pool_fixtures"]


def test_add_returns_a_snapshot_and_a_lease_is_a_sandbox(shared_pool: SandboxPool, base_snapshot: Snapshot) -> None:
    """pool.add gives a Snapshot; acquire gives a pool.Lease that satisfies the Sandbox protocol and works like one."""
    assert isinstance(base_snapshot, Snapshot)
    assert base_snapshot.template == "pooltest-base" and base_snapshot.workdir == "/workspace"
    lease = shared_pool.acquire(base_snapshot)
    try:
        assert isinstance(lease, pool.Lease)
        assert isinstance(lease, pool.Sandbox)
        assert lease.start_digest == base_snapshot.digest
        assert lease.start_snapshot == base_snapshot
        assert lease.is_alive and not lease.is_closed
        assert lease.id and lease.labels["snapgym.pool"].startswith("pool-") and lease.labels["snapgym.owner"]
        result = lease.exec("cat a; pwd")
        assert isinstance(result, ExecResult)
        assert result.ok and result.stdout == "hi\n/workspace\n"
        lease.write_file("/workspace/notes/new.txt", "written through the lease\n")
        assert lease.read_file("notes/new.txt") == b"written through the lease\n"
        assert lease.exec("cat notes/new.txt").stdout == "written through the lease\n"
        assert lease.exec("echo $X; pwd", env={"X": "y"}, cwd="/tmp").stdout == "y\n/tmp\n"
        assert lease.exec("cat", stdin="piped").stdout == "piped"
    finally:
        lease.release()
    assert lease.is_closed and not lease.is_alive


def test_non_zero_exit_and_timeout_are_data(shared_pool: SandboxPool, base_snapshot: Snapshot) -> None:
    """A failing command returns its exit code and output; a timeout returns timed_out, neither raises."""
    with shared_pool.acquire(base_snapshot) as lease:
        result = lease.exec("echo out; echo err >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr, result.ok) == (3, "out\n", "err\n", False)
        slow = lease.exec("sleep 30", timeout_s=0.5)
        assert slow.timed_out and not slow.ok
        assert lease.exec("echo still usable").stdout == "still usable\n"


def test_release_restores_the_sandbox_to_the_snapshot(single_pool: SandboxPool, single_snapshot: Snapshot) -> None:
    """The signature test: what one lease did is gone when the same pooled sandbox is leased again."""
    with single_pool.acquire(single_snapshot) as first:
        key = slot_key(first)
        first.write_file("/workspace/leftover", "from the previous episode")
        first.exec("rm a; echo changed > src/main.py; mkdir -p /root/junk; (sleep 300 >/dev/null 2>&1 &)")
    with single_pool.acquire(single_snapshot, timeout_s=30) as again:
        assert slot_key(again) == key  # the one sandbox of this pool, restored
        assert again.start_digest == single_snapshot.digest
        listing = again.exec("ls -A /workspace; cat src/main.py; ls /root; ps -eo args | grep -c '^sleep 300'")
        assert listing.stdout == "a\nsrc\nprint(1)\n0\n", listing
        assert again.read_file("a") == b"hi\n"


def test_context_manager_releases_on_exit_and_on_error(shared_pool: SandboxPool, base_snapshot: Snapshot) -> None:
    """`with pool.acquire(...)` releases the lease on exit, also when the body raises; release is idempotent."""
    before = shared_pool.stats()["releases"]
    with shared_pool.acquire(base_snapshot) as lease:
        assert lease.exec("true").ok
    assert lease.is_closed
    with pytest.raises(RuntimeError, match="boom"), shared_pool.acquire(base_snapshot) as failing:
        raise RuntimeError("boom")
    assert failing.is_closed
    failing.release()
    shared_pool.release(failing)
    wait_until(lambda: shared_pool.stats()["releases"] >= before + 2, "two releases to reach the pool")
    assert shared_pool.stats()["releases"] == before + 2


def test_calls_after_release_raise_sandbox_closed(shared_pool: SandboxPool, base_snapshot: Snapshot) -> None:
    """Every sandbox call on a released lease raises SandboxClosedError, naming the way out."""
    lease = shared_pool.acquire(base_snapshot)
    lease.release()
    with pytest.raises(SandboxClosedError, match="acquire a new lease"):
        lease.exec("true")
    with pytest.raises(SandboxClosedError):
        lease.read_file("a")
    with pytest.raises(SandboxClosedError):
        lease.write_file("b", "x")
    with pytest.raises(SandboxClosedError):
        lease.snapshot()
    with pytest.raises(SandboxClosedError):
        lease.restore()


def test_mid_lease_snapshot_and_restore(shared_pool: SandboxPool) -> None:
    """lease.snapshot() freezes files; restore(s2) brings them back; restore() returns to the last start."""
    start = shared_pool.add(side_template("midlease"))
    with shared_pool.acquire(start) as lease:
        lease.write_file("/workspace/step1", "one")
        lease.restore()  # back to where the lease started
        assert lease.exec("ls /workspace").stdout == "a\n"
        lease.write_file("/workspace/step1", "one")
        s2 = lease.snapshot()
        assert isinstance(s2, Snapshot) and s2.digest != start.digest
        lease.write_file("/workspace/step2", "two")
        lease.exec("rm /workspace/a")
        lease.restore(s2)
        assert lease.exec("ls /workspace").stdout == "a\nstep1\n"
        assert lease.read_file("step1") == b"one"
        assert lease.start_digest == s2.digest and lease.start_snapshot == s2
        lease.write_file("/workspace/step3", "three")
        lease.restore()  # the last start is now s2
        assert lease.exec("ls /workspace").stdout == "a\nstep1\n"
        lease.restore(start)
        assert lease.exec("ls /workspace").stdout == "a\n"
        assert lease.start_digest == start.digest


def test_release_after_mid_lease_restore_goes_back_to_the_pool_snapshot(
    single_pool: SandboxPool, single_snapshot: Snapshot
) -> None:
    """After lease.restore(s2) and release, the next lease of that sandbox starts at the pool's snapshot, not s2."""
    with single_pool.acquire(single_snapshot) as lease:
        lease.write_file("/workspace/secret", "answer key of the previous episode")
        s2 = lease.snapshot()
        lease.restore(s2)
    with single_pool.acquire(single_snapshot, timeout_s=30) as again:
        try:
            assert again.start_digest == single_snapshot.digest
            assert again.exec("ls /workspace").stdout == "a\nsrc\n"
        finally:
            again.restore(single_snapshot)  # leave the shared sandbox at the pool's snapshot


def test_release_after_failed_restore_returns_the_slot(shared_pool: SandboxPool) -> None:
    """A lease whose restore(snapshot) failed still goes back to the pool when released."""
    start = shared_pool.add(side_template("failed-restore"))
    foreign = Snapshot(id="not-on-this-host", digest="0" * 64, backend="local", workdir="/workspace")
    before = shared_pool.stats()["releases"]
    lease = shared_pool.acquire(start)
    with pytest.raises(SandboxError, match="restore failed"):
        lease.restore(foreign)
    lease.release()
    try:
        deadline = time.monotonic() + 1.5  # well below lease_ttl_s, when the pool reclaims it anyway
        while shared_pool.stats()["releases"] == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert shared_pool.stats()["releases"] == before + 1
    finally:  # let the reclaim put the slot back before other tests count leases
        wait_until(lambda: snapshot_stats(shared_pool, start)["leased"] == 0, "the stuck slot to be reclaimed")


def test_stats_report_slots_latencies_counters_hosts_and_targets(
    shared_pool: SandboxPool, base_snapshot: Snapshot
) -> None:
    """stats() has slots by state, acquire/restore percentiles, counters, live hosts and per-snapshot targets."""
    before = shared_pool.stats()
    for _ in range(3):
        with shared_pool.acquire(base_snapshot) as lease:
            lease.exec("touch /workspace/x")
    wait_until(lambda: settled(shared_pool, base_snapshot), "the releases to be restored")
    stats = shared_pool.stats()
    assert set(stats["slots"]) == {"ready", "leased", "restoring", "failed"}
    assert all(isinstance(n, int) and n >= 0 for n in stats["slots"].values())
    assert stats["slots"]["ready"] >= 2
    assert stats["acquires"] >= before["acquires"] + 3
    assert stats["releases"] >= before["releases"] + 3
    for key in ("acquire_wait_ms", "restore_ms"):
        latency = stats[key]
        assert latency["n"] >= 3, key
        assert 0 <= latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"], key
    for counter in ("failures", "recreations", "reclaimed_leases", "lost_leases", "host_failures", "host_restarts"):
        assert isinstance(stats[counter], int) and stats[counter] >= 0
    assert stats["hosts"] and all(h["alive"] for h in stats["hosts"])
    assert {"id", "node_id", "alive", "slots", "capacity"} <= set(stats["hosts"][0])
    assert sum(h["slots"] for h in stats["hosts"]) == sum(stats["slots"].values())
    mine = stats["snapshots"][base_snapshot.id]
    assert mine["warm_target"] >= 2 and mine["ready"] >= 2
    assert mine["crash_looping"] is False and mine["last_error"] is None


def test_warm_up_reaches_n_ready(shared_pool: SandboxPool) -> None:
    """warm_up(snapshot, n = min_warm) returns once n sandboxes are ready, and they lease out at once."""
    start = shared_pool.add(side_template("warmup"))
    assert shared_pool.warm_up(start, 2, timeout_s=60) >= 2
    assert snapshot_stats(shared_pool, start)["ready"] >= 2
    leases = [shared_pool.acquire(start, timeout_s=30) for _ in range(3)]
    try:
        assert all(lease.exec("cat a").stdout == "hi\n" for lease in leases)
    finally:
        for lease in leases:
            lease.release()


def test_warm_up_above_min_warm_reaches_n_and_keeps_them_for_idle_s(shared_pool: SandboxPool) -> None:
    """warm_up(snapshot, 6) on a pool with min_warm=2 reaches 6 ready, kept while idle for less than idle_s (10 s)."""
    start = shared_pool.add(side_template("warmup-keep"))
    assert shared_pool.warm_up(start, 6, timeout_s=30) >= 6
    time.sleep(1.5)
    assert snapshot_stats(shared_pool, start)["ready"] >= 6


def test_config_validation_raises_config_error(ray_cluster: None) -> None:
    """Inconsistent PoolConfig values raise ConfigError (a ValueError) naming the problem."""
    with pytest.raises(ConfigError, match="min_warm <= max_warm"):
        PoolConfig(min_warm=5, max_warm=2)
    with pytest.raises(ValueError, match="min_warm"):
        PoolConfig(min_warm=-1)
    with pytest.raises(ConfigError, match="max_size"):
        PoolConfig(max_size=0)
    with pytest.raises(ConfigError, match="lease_ttl_s must be positive"):
        PoolConfig(lease_ttl_s=0)
    with pytest.raises(ConfigError, match="max_failures"):
        PoolConfig(max_failures=0)
    with pytest.raises(ConfigError, match="PoolConfig"):
        SandboxPool({"min_warm": 1})  # type: ignore[arg-type]


def test_acquire_of_a_snapshot_never_added_names_pool_add(shared_pool: SandboxPool) -> None:
    """Acquiring a snapshot the pool does not serve raises PoolError telling the caller to pool.add it."""
    unknown = Snapshot(id="never-added", digest="0" * 64, backend="local")
    with pytest.raises(PoolError, match=r"never-added.*pool\.add"):
        shared_pool.acquire(unknown, timeout_s=1)
    with pytest.raises(PoolError, match=r"pool\.add"):
        shared_pool.acquire("also-never-added", timeout_s=1)


def _not_importable_on_the_host(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[pool.Sandbox], str]:
    """A module-level function from a module only this process can import (its folder is on no host's path)."""
    (folder / "snapgym_beside_probe.py").write_text("def probe(sandbox):\n    return sandbox.id\n")
    monkeypatch.syspath_prepend(str(folder))
    module = importlib.import_module("snapgym_beside_probe")
    probe: Callable[[pool.Sandbox], str] = module.probe
    return probe


def test_run_beside_runs_in_the_host_with_the_real_sandbox(
    shared_pool: SandboxPool, base_snapshot: Snapshot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_beside ships the function to the host's process, which calls it with the sandbox itself (one
    round trip); a sandbox error inside comes back as itself; a function the host cannot import is a clear
    error, not a lost host; a released lease refuses, like any call."""
    import operator

    from pool.cluster.beside import run_beside

    with shared_pool.acquire(base_snapshot) as lease:
        lease.write_file("/workspace/beside.txt", "beside\n")
        assert run_beside(lease, operator.attrgetter("__class__.__name__")) == "LocalSandbox"
        assert run_beside(lease, operator.methodcaller("read_file", "/workspace/beside.txt")) == b"beside\n"
        with pytest.raises(pool.FileOperationError):
            run_beside(lease, operator.methodcaller("read_file", "/no/such/file"))
        with pytest.raises(ConfigError, match="importable"):
            run_beside(lease, _not_importable_on_the_host(tmp_path, monkeypatch))
        assert lease.is_alive and lease.exec("cat beside.txt").stdout == "beside\n"
    with pytest.raises(SandboxClosedError):
        run_beside(lease, operator.attrgetter("id"))
