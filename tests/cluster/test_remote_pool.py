"""A cloud backend behind the Ray pool (E2B, through the real SDK, against the stand-in): leases work,
and when a host actor dies its sandboxes at the provider are ended through a live host instead of
running (and billing) until their lifetime."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from pool import PoolConfig, SandboxPool, Template
from pool.labels import HOST, POOL
from tests.backends.cloud.e2b.standin import E2BStandin
from tests.support.fixtures.pool_fixtures import wait_until

pytest_plugins = ["tests.backends.cloud.e2b.standin", "tests.support.fixtures.pool_fixtures"]

TEMPLATE = Template(name="remote-pool", setup=["mkdir -p /w && echo ready > /w/state"], workdir="/w")


@pytest.fixture
def e2b_pool(ray_cluster: None, e2b_standin: E2BStandin) -> Iterator[SandboxPool]:
    options = {"api_key": e2b_standin.api_key, "api_url": e2b_standin.url, "sandbox_url": e2b_standin.url}
    pool = SandboxPool(PoolConfig(backend="e2b", backend_options=options, min_warm=1, max_warm=2, max_size=4,
                                  lease_ttl_s=5, tick_s=0.1))  # fmt: skip
    try:
        yield pool
    finally:
        pool.close()


def test_a_dead_hosts_cloud_sandboxes_are_ended_through_a_live_host(
    e2b_pool: SandboxPool, e2b_standin: E2BStandin
) -> None:
    snapshot = e2b_pool.add(TEMPLATE)
    lease = e2b_pool.acquire(snapshot)
    assert lease.exec("cat state").stdout == "ready\n"
    dead_host = lease._grant.host_id

    def of_dead_host() -> list[str]:
        return [sid for sid, r in e2b_standin.sandboxes().items()
                if r.state == "running" and r.metadata.get(HOST) == dead_host]  # fmt: skip

    assert of_dead_host(), "the host's sandboxes carry its label"
    assert all(r.metadata.get(POOL) for r in e2b_standin.sandboxes().values() if r.metadata.get(HOST))
    ray.kill(lease._host, no_restart=True)
    wait_until(lambda: e2b_pool.stats()["remote_reaped"] >= 1, "the pool to end the dead host's sandboxes", 90)
    time.sleep(0.5)  # a spare the dead host had on the wire
    assert of_dead_host() == []
    lease.release()
    fresh = e2b_pool.acquire(snapshot)  # the replacement host serves
    try:
        assert fresh.exec("cat state").stdout == "ready\n"
    finally:
        fresh.release()


def test_the_creation_pace_is_one_bucket_for_the_whole_ray_cluster(ray_cluster: None, tmp_path: Path) -> None:
    """Two limiters for the same account (two hosts of a pool, on any nodes) take from one named actor."""
    from pool.backends.remote.ratelimit import RayLimiter, shared_limiter

    first = shared_limiter(4.0, 1, tmp_path / "a.bucket", key="test-cluster-pace")
    second = shared_limiter(4.0, 1, tmp_path / "b.bucket", key="test-cluster-pace")
    assert isinstance(first, RayLimiter) and isinstance(second, RayLimiter)
    started = time.monotonic()
    for _ in range(5):
        first.acquire()
        second.acquire()
    assert time.monotonic() - started >= 9 / 4 * 0.9  # ten tokens at 4/s after a burst of one, not 2 x 5 at once
    assert not (tmp_path / "a.bucket").exists()  # the cluster's bucket, not the machine's file


def test_a_pool_on_a_cloud_backend_paces_through_the_cluster_bucket(e2b_pool: SandboxPool) -> None:
    e2b_pool.add(TEMPLATE)
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    assert any(name.startswith("snapgym-ratelimit-e2b-") for name in names), names
