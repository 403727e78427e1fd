"""Shared pieces of the SandboxPool tests: one Ray instance and one pool per session, templates, helpers.

Test modules load this with ``pytest_plugins = ["tests.support.pool_fixtures"]`` and import its helpers. Ray workers
cannot import this file (``tests/`` is not on their path), so it is pickled by value: the Ray task and
actor below travel with their code. It has no asserts of its own (PYTEST_DONT_REWRITE: the test modules
import it before pytest could rewrite it).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import ray
from ray.cloudpickle.cloudpickle import register_pickle_by_value

from pool import Snapshot, Template
from pool.cluster.config import PoolConfig
from pool.cluster.lease import Lease
from pool.cluster.sandbox_pool import SandboxPool

register_pickle_by_value(sys.modules[__name__])

T = TypeVar("T")

BASE_TEMPLATE = Template(
    name="pooltest-base",
    setup=["echo hi > a", "mkdir -p src && echo 'print(1)' > src/main.py"],
    workdir="/workspace",
    healthcheck="test -f /workspace/a",
)
"""The template most tests lease sandboxes of (the shared pool serves it)."""

LIMITS = {"memory_limit_mb": 256, "pids_limit": 256, "disk_limit_mb": 64}


def side_template(purpose: str) -> Template:
    """A template of its own for a test that leaves its snapshot's sandboxes in an odd state."""
    return Template(name=f"pooltest-{purpose}", setup=["echo hi > a"], workdir="/workspace")


# -- fixtures -----------------------------------------------------------------


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A local Ray instance for the whole session (reused if something else started one)."""
    started = not ray.is_initialized()
    if started:
        # address="local": a private instance, even if a `ray start` cluster runs on this machine
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def pool_backend_options(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """LocalBackend options of every test pool: small limits, a store of the session's own."""
    return {**LIMITS, "store_dir": str(tmp_path_factory.mktemp("pool-store"))}


@pytest.fixture(scope="session")
def shared_pool(ray_cluster: None, pool_backend_options: dict[str, Any]) -> Iterator[SandboxPool]:
    """The one pool most tests share."""
    config = PoolConfig(
        min_warm=2, max_warm=8, max_size=32, lease_ttl_s=2, tick_s=0.1, backend_options=pool_backend_options
    )
    pool = SandboxPool(config)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def base_snapshot(shared_pool: SandboxPool) -> Snapshot:
    """BASE_TEMPLATE, served by the shared pool."""
    return shared_pool.add(BASE_TEMPLATE)


@pytest.fixture(scope="session")
def single_pool(ray_cluster: None, pool_backend_options: dict[str, Any]) -> Iterator[SandboxPool]:
    """A pool of exactly one sandbox, so every acquire gets the sandbox the previous lease held.

    Tests that use it leave that sandbox clean (at BASE_TEMPLATE, restored to it on release).
    """
    config = PoolConfig(
        min_warm=1, max_warm=1, max_size=1, lease_ttl_s=2, tick_s=0.1, backend_options=pool_backend_options
    )
    pool = SandboxPool(config)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def single_snapshot(single_pool: SandboxPool) -> Snapshot:
    """BASE_TEMPLATE, served by the one-sandbox pool."""
    return single_pool.add(BASE_TEMPLATE)


@pytest.fixture()
def make_pool(ray_cluster: None, pool_backend_options: dict[str, Any]) -> Iterator[Callable[..., SandboxPool]]:
    """A factory of differently configured pools on the session's Ray instance, closed after the test."""
    made: list[SandboxPool] = []

    def make(**overrides: Any) -> SandboxPool:
        settings: dict[str, Any] = {"lease_ttl_s": 2, "tick_s": 0.1, "backend_options": pool_backend_options}
        settings.update(overrides)
        pool = SandboxPool(PoolConfig(**settings))
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.close()


# -- helpers ------------------------------------------------------------------


def wait_until(probe: Callable[[], T], what: str, timeout_s: float = 20.0, every_s: float = 0.05) -> T:
    """Poll ``probe`` until it returns something truthy; fail the test naming ``what`` if it never does."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what} (last value: {value!r})")
        time.sleep(every_s)


def snapshot_stats(pool: SandboxPool, snapshot: Snapshot) -> dict[str, Any]:
    """stats() of one served snapshot."""
    stats: dict[str, Any] = pool.stats()["snapshots"][snapshot.id]
    return stats


def settled(pool: SandboxPool, snapshot: Snapshot) -> bool:
    """No sandbox of the snapshot is being restored or created."""
    s = snapshot_stats(pool, snapshot)
    return s["restoring"] == 0 and s["creating"] == 0


def slot_key(lease: Lease) -> tuple[str, int]:
    """Which pooled sandbox a lease holds: (host id, slot number)."""
    return (lease._grant.host_id, lease._grant.slot)


def host_pid(lease: Lease) -> int:
    """Process id of the host actor that holds a lease's sandbox."""
    return int(ray.get(lease._host.ping.remote(), timeout=30)["pid"])


def manager_pid(pool: SandboxPool) -> int:
    """Process id of a pool's manager actor."""
    return int(ray.get(pool._manager.__ray_call__.remote(_own_pid), timeout=30))


def _own_pid(_actor: object) -> int:
    return os.getpid()


def process_args(pid: int) -> str | None:
    """The command line of a live (not zombie) process, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if stat.rpartition(")")[2].split()[0] in ("Z", "X"):
        return None
    return cmdline.replace(b"\0", b" ").decode(errors="replace").strip()


def child_pids(pid: int) -> list[int]:
    """Direct children of a process."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            children.append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the process tree."""
    found, todo = [], [pid]
    while todo:
        children = child_pids(todo.pop())
        found.extend(children)
        todo.extend(children)
    return found


def sandboxd_pids(host: int) -> list[int]:
    """The sandbox daemon(s) a host actor process started."""
    return [pid for pid in child_pids(host) if "sandboxd" in (process_args(pid) or "")]


def sandbox_init_pid(lease: Lease) -> int:
    """Process id (on this machine) of the init of a lease's sandbox, asked of its host actor."""
    return int(ray.get(lease._host.__ray_call__.remote(_init_pid, lease._grant.slot), timeout=30))


def _init_pid(host: Any, slot: int) -> int:
    from pool.backends.local.daemon import Op

    sandbox = host._slots[slot]
    return int(sandbox._runtime.request(Op.PING, sandbox.number, [])["pid"])


# -- what runs in other Ray processes ----------------------------------------


@ray.remote(num_cpus=0)
def lease_in_task(pool: SandboxPool, snapshot: Snapshot) -> dict[str, Any]:
    """Acquire from a pickled pool inside a Ray task, run a command, release."""
    with pool.acquire(snapshot, timeout_s=30) as lease:
        result = lease.exec("cat a; echo from-task > task-was-here; echo $$")
        return {"stdout": result.stdout, "digest": lease.start_digest, "pid": os.getpid()}


@ray.remote(num_cpus=0)
class Holder:
    """A Ray actor that holds a lease until it is killed."""

    def __init__(self) -> None:
        self.lease: Lease | None = None

    def take(self, pool: SandboxPool, snapshot: Snapshot) -> tuple[str, int]:
        """Acquire a lease, leave a mark in its sandbox, and keep it."""
        self.lease = pool.acquire(snapshot, timeout_s=30)
        self.lease.write_file("/workspace/holder-was-here", "x")
        return slot_key(self.lease)
