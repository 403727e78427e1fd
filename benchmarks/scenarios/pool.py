"""Pool: what leasing through Ray costs, against the backend used directly, and how many sandboxes one machine holds.

Method:
    A SandboxPool starts on a local Ray instance (or the cluster Ray is
    connected to) with one host actor per node. The template is a small
    workspace (``echo`` into /w). Then, in one run and in this order:

    - ``acquire``: before each iteration, untimed, the pool is asked to have
      ``min_warm`` sandboxes ready (``warm_up``); only ``pool.acquire()`` is
      timed (a manager actor call and the lease's set-up); the release after
      it is untimed.
    - ``reset``: a full episode boundary through the pool: ``lease.release()``
      (which starts the restore in the background) and ``pool.acquire()`` of
      the next ready sandbox, timed together; untimed before each iteration,
      one exec dirties the leased sandbox.
    - ``exec_lease`` and ``exec_direct``: ``exec("true")`` through a lease
      (a host actor call) and on a sandbox of the same backend used directly
      in this process, alternating iteration by iteration so both see the
      same machine noise. ``exec_overhead_ms`` is the difference of the p50s.
    - capacity: a second pool with ``capacity.sandboxes`` as its size warms
      that many sandboxes. Memory is MemTotal - MemAvailable from
      /proc/meminfo of every machine that hosts the pool's sandboxes (each
      host actor reads its own machine; machines are told apart by kernel
      boot id, so two Ray nodes on one machine count once), summed, read
      after the pool's actors are up and before the sandboxes start (Ray's
      fixed cost), and again once they are all ready; the difference divided
      by the number ready is the cost per sandbox.

    Each latency method runs ``warmup`` discarded iterations, then its
    repetitions; the clock is ``time.perf_counter_ns`` around the timed calls.
    Percentiles as in reset_latency (numpy, linear interpolation).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.job import Job
from benchmarks.reports.report import Report, Skipped, Target
from benchmarks.reports.stats import percentile
from benchmarks.scenarios.measure.timing import measure
from pool import Backend, PoolConfig, SandboxPool, Snapshot, Template
from pool.backends import backend_class

TEMPLATE = Template(name="bench-pool", setup=["mkdir -p /w && echo ready > /w/state"], workdir="/w")


@dataclass
class PoolRepetitions:
    """Timed iterations per method."""

    acquire: int = 200
    """Time ``pool.acquire()`` of a warm sandbox."""
    reset: int = 200
    """Time ``lease.release()`` + ``pool.acquire()``."""
    exec: int = 200
    """Time ``exec("true")`` through a lease and directly (each)."""


@dataclass
class PoolCapacity:
    """The warm-capacity measurement."""

    sandboxes: int = 256
    """Sandboxes to warm at once; 0 skips the measurement."""
    timeout_s: float = 300.0
    """How long to wait for them to be ready."""


@dataclass
class PoolTargets:
    """Thresholds reported as met or missed."""

    acquire_p50_ms: float = 2.0
    """acquire p50 must be at most this."""
    exec_overhead_ms: float = 1.5
    """exec through a lease may cost at most this much more than direct (p50s)."""
    warm_sandboxes_min: int = 256
    """At least this many sandboxes must be warm at once."""
    memory_per_sandbox_mib: float = 5.0
    """Each warm sandbox may cost at most this much memory."""


@dataclass
class PoolBenchConfig:
    """What leasing costs through Ray, and how many warm sandboxes one machine holds."""

    name: str = "pool"
    """Scenario name; selects the module in ``benchmarks/scenarios``."""
    warmup: int = 5
    """Iterations run and discarded before each method's timed ones."""
    min_warm: int = 8
    """Ready sandboxes the latency pool keeps."""
    repetitions: PoolRepetitions = field(default_factory=PoolRepetitions)
    """Timed iterations per method."""
    capacity: PoolCapacity = field(default_factory=PoolCapacity)
    """The warm-capacity measurement."""
    targets: PoolTargets = field(default_factory=PoolTargets)
    """Thresholds checked in the summary."""


def run(job: Job) -> Report:
    """Measure the pool against the job's backend used directly."""
    cfg: PoolBenchConfig = job.settings
    backend = job.backend
    options = _backend_options(job)
    methods: dict[str, list[float] | Skipped] = {}
    pool = SandboxPool(PoolConfig(min_warm=cfg.min_warm, max_warm=cfg.min_warm, max_size=4 * cfg.min_warm,
                                  backend=backend.name, backend_options=options))  # fmt: skip
    try:
        snapshot = pool.add(TEMPLATE)
        pool.warm_up(snapshot, cfg.min_warm)
        methods["acquire"] = _acquire(cfg, pool, snapshot)
        methods["reset"] = _reset(cfg, pool, snapshot)
        methods["exec_lease"], methods["exec_direct"] = _exec(cfg, pool, snapshot, backend)
        pool_stats = pool.stats()
    finally:
        pool.close()
    capacity = (
        _capacity(cfg, backend.name, options) if cfg.capacity.sandboxes > 0 else {"skipped": "capacity.sandboxes=0"}
    )
    overhead = _p50_gap(methods["exec_lease"], methods["exec_direct"])
    return Report(
        scenario="pool",
        methods=methods,
        targets=_targets(cfg, methods, overhead, capacity),
        meta={"exec_overhead_ms": overhead, "capacity": capacity, "pool_stats": pool_stats, "config": asdict(cfg)},
    )


def _acquire(cfg: PoolBenchConfig, pool: SandboxPool, snapshot: Snapshot) -> list[float]:
    return measure(
        lambda: pool.acquire(snapshot),
        repetitions=cfg.repetitions.acquire,
        warmup=cfg.warmup,
        before=lambda: pool.warm_up(snapshot, cfg.min_warm),
        after=lambda lease: lease.release(),
    )


def _reset(cfg: PoolBenchConfig, pool: SandboxPool, snapshot: Snapshot) -> list[float]:
    held = [pool.acquire(snapshot)]

    def release_and_acquire() -> None:
        held[0].release()
        held[0] = pool.acquire(snapshot)

    def dirty() -> None:
        held[0].exec("echo dirty > /w/state")
        pool.warm_up(snapshot, cfg.min_warm // 2)

    try:
        return measure(release_and_acquire, repetitions=cfg.repetitions.reset, warmup=cfg.warmup, before=dirty)
    finally:
        held[0].release()


def _exec(cfg: PoolBenchConfig, pool: SandboxPool, snapshot: Snapshot, backend: Backend) -> tuple[list[float], ...]:
    lease = pool.acquire(snapshot)
    direct = backend.create(backend.build(TEMPLATE))
    leased: list[float] = []
    local: list[float] = []
    try:
        for index in range(cfg.warmup + cfg.repetitions.exec):
            lease_ms = _time_ms(lambda: lease.exec("true"))
            direct_ms = _time_ms(lambda: direct.exec("true"))
            if index >= cfg.warmup:
                leased.append(lease_ms)
                local.append(direct_ms)
    finally:
        lease.release()
        direct.close()
    return leased, local


def _capacity(cfg: PoolBenchConfig, backend: str, options: dict[str, Any]) -> dict[str, Any]:
    n = cfg.capacity.sandboxes
    pool = SandboxPool(
        PoolConfig(min_warm=0, max_warm=n, max_size=n, host_capacity=n, backend=backend, backend_options=options)
    )
    try:
        snapshot = pool.add(TEMPLATE)
        time.sleep(1.0)
        before = sum(pool.machine_memory().values())
        started = time.perf_counter()
        ready = pool.warm_up(snapshot, n, timeout_s=cfg.capacity.timeout_s)
        warm_s = time.perf_counter() - started
        time.sleep(1.0)
        machines = pool.machine_memory()
        after = sum(machines.values())
    finally:
        pool.close()
    per_sandbox = (after - before) / ready / 2**20 if ready else None
    found: dict[str, Any] = {}
    if per_sandbox is not None and per_sandbox <= 0:  # the machine freed more than the sandboxes took
        found["memory_note"] = (
            f"used memory fell by {(before - after) / 2**20:.1f} MiB while {ready} sandboxes warmed (other processes "
            "freed memory): no figure; run it again on a quieter machine"
        )
        per_sandbox = None
    return {"requested": n, "ready": ready, "warm_up_s": warm_s, "memory_per_sandbox_mib": per_sandbox,
            "used_before_mib": before / 2**20, "used_after_mib": after / 2**20, "machines": len(machines),
            **found}  # fmt: skip


def _targets(
    cfg: PoolBenchConfig, methods: dict[str, list[float] | Skipped], overhead: float | None, capacity: dict[str, Any]
) -> list[Target]:
    t = cfg.targets
    acquire = methods["acquire"]
    return [
        Target("acquire_p50_ms", f"acquire p50 <= {t.acquire_p50_ms:g} ms", t.acquire_p50_ms,
               None if isinstance(acquire, Skipped) else percentile(acquire, 50)),
        Target("exec_overhead_ms", f"lease exec - direct <= {t.exec_overhead_ms:g} ms", t.exec_overhead_ms, overhead),
        Target("warm_sandboxes", f"warm sandboxes >= {t.warm_sandboxes_min}", t.warm_sandboxes_min,
               capacity.get("ready"), at_most=False),
        Target("memory_per_sandbox_mib", f"memory per sandbox <= {t.memory_per_sandbox_mib:g} MiB",
               t.memory_per_sandbox_mib, capacity.get("memory_per_sandbox_mib")),
    ]  # fmt: skip


def _p50_gap(a: list[float] | Skipped, b: list[float] | Skipped) -> float | None:
    if isinstance(a, Skipped) or isinstance(b, Skipped) or not a or not b:
        return None
    return percentile(a, 50) - percentile(b, 50)


def _time_ms(call: Callable[[], object]) -> float:
    started = time.perf_counter_ns()
    call()
    return (time.perf_counter_ns() - started) / 1e6


def _backend_options(job: Job) -> dict[str, Any]:
    """The configured backend options (limits included, so leased and direct sandboxes are alike),
    with process-dependent defaults (the local store) settled as the direct backend settled them, so
    the pool's hosts reuse its builds."""
    resolved: dict[str, Any] = backend_class(job.config.backend.name).resolve_options(job.backend_options())
    return resolved
