"""Burst: N episodes starting at once, against the same N one after another.

Method:
    Providers slow down when many sandboxes are asked for together (1.2-5x in
    published measurements), and an RL step that starts a group of rollouts
    is exactly such a burst. For each N in ``sizes``, N environments of the
    trivial task are made (no sandbox yet, untimed) and each plays its first
    ``reset()`` and one ``true`` step: the time to first command of an
    episode. *Sequential*: one after another, each timed alone. *Burst*: N
    threads released together by a barrier, each timing its own reset and
    step. The environments are closed afterwards (untimed). On ``pool=direct``
    a first reset creates a sandbox from the task snapshot; on ``pool=ray`` it
    leases one (warm when the pool has them). Reported per N: percentiles of
    both, and two ratios. ``burst_N_per_request``: the burst's wall time (the
    last start's) divided by N, over the sequential median: what a request
    costs when N come at once against one at a time; the target is checked on
    it. ``burst_N_latency``: the burst's median latency over the sequential
    median, the form providers publish for their remote machines; on a local
    backend the starts share this machine's cores, so it grows with N over
    the number of cores whatever the backend does. ``rounds`` repeats each N;
    the snapshot is built, and one sandbox created and closed, before
    anything is timed.

    *Time to first command* (``ttfc``), in the form cloud providers publish
    it: ``backend.create(snapshot)`` and the first ``exec("true")`` returning,
    ``ttfc_samples`` times one after another, without the environment (local
    and Docker backends; the pool leases instead of creating).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.episodes.sources.routing import Supply
from benchmarks.episodes.sources.supply import BackendSupply
from benchmarks.job import Job
from benchmarks.reports.report import Report, Skipped, Target
from benchmarks.reports.stats import percentile
from benchmarks.scenarios.eval import open_supply
from benchmarks.scenarios.measure.timing import measure
from benchmarks.scenarios.throughput import TRIVIAL_TASK
from benchmarks.schemas import PoolKind
from envs.tasks import load_task
from envs.wrappers import sandbox_env
from pool.errors import ConfigError

Env = Any
"""A Gymnasium environment of the supply (``gym.Env``; kept loose for the threads' closures)."""


@dataclass
class BurstConfig:
    """Concurrent first resets and first commands, against the same one after another."""

    name: str = "burst"
    """Scenario name."""
    sizes: list[int] = field(default_factory=lambda: [16, 64, 256])
    """Numbers of episodes started at once."""
    rounds: int = 1
    """Bursts (and sequential runs) per size."""
    ttfc_samples: int = 50
    """Timed create + first exec, one after another."""
    target_ratio: float = 1.2
    """A burst's cost per request over the sequential p50, at the target size: met or missed."""
    target_size: int = 64
    """The size the ratio target is checked at."""
    target_ttfc_ms: float = 3.0
    """Time to first command p50, reported as met or missed."""


def run(job: Job) -> Report:
    """Time bursts, sequential runs and time to first command; see the module docstring."""
    cfg: BurstConfig = job.settings
    if not cfg.sizes or min(cfg.sizes) < 1 or cfg.rounds < 1 or cfg.ttfc_samples < 0:
        raise ConfigError("benchmark.sizes must be positive, benchmark.rounds >= 1 and ttfc_samples >= 0")
    supply = open_supply(job, job.config)
    task = load_task(TRIVIAL_TASK)

    def make_env() -> Env:
        return supply.make_env("snapgym/Shell-v0", task, max_steps=10**6)

    methods: dict[str, list[float] | Skipped] = {}
    walls: dict[int, float] = {}
    try:
        warm = make_env()
        warm.reset(seed=0)  # builds the snapshot; untimed
        snapshot = sandbox_env(warm).task_snapshot
        warm.close()
        methods["ttfc"] = _ttfc(supply, snapshot, cfg.ttfc_samples)
        for n in sorted(set(cfg.sizes)):
            methods[f"sequential_{n}"] = [ms for _ in range(cfg.rounds) for ms in _sequential(make_env, n)]
            bursts = [_burst(make_env, n) for _ in range(cfg.rounds)]
            methods[f"burst_{n}"] = [ms for samples in bursts for ms in samples]
            walls[n] = percentile([max(samples) / n for samples in bursts], 50)
    finally:
        supply.close()
    ratios: dict[str, float | None] = {}
    for n in sorted(set(cfg.sizes)):
        sequential = percentile(methods[f"sequential_{n}"], 50)  # type: ignore[arg-type]
        ratios[f"burst_{n}_per_request"] = walls[n] / sequential
        ratios[f"burst_{n}_latency"] = percentile(methods[f"burst_{n}"], 50) / sequential  # type: ignore[arg-type]
    ttfc = methods["ttfc"]
    ttfc_p50 = None if isinstance(ttfc, Skipped) else percentile(ttfc, 50)
    size, ratio = cfg.target_size, cfg.target_ratio
    targets = [
        Target("ttfc_p50_ms", f"time to first command p50 <= {cfg.target_ttfc_ms:g} ms", cfg.target_ttfc_ms, ttfc_p50),
        Target(f"burst_{size}_ratio", f"burst per request at {size} / sequential <= {ratio:g}", ratio,
               ratios.get(f"burst_{size}_per_request")),
    ]  # fmt: skip
    meta = {"pool": PoolKind(job.config.pool.kind).value, "sizes": sorted(set(cfg.sizes)), "rounds": cfg.rounds}
    return Report("burst", methods, ratios=ratios, targets=targets, meta=meta, headline=dict(ratios))


def _ttfc(supply: Supply, snapshot: Any, samples: int) -> list[float] | Skipped:
    """create + first exec, one after another, on the supply's backend."""
    if samples == 0:
        return Skipped("ttfc_samples is 0")
    if not isinstance(supply, BackendSupply):
        return Skipped("pool=ray leases sandboxes instead of creating them: run with pool=direct")
    backend = supply.backend
    return measure(
        lambda: _first_command(backend.create(snapshot)), repetitions=samples, warmup=2, after=lambda s: s.close()
    )


def _first_command(sandbox: Any) -> Any:
    result = sandbox.exec("true")
    if result.exit_code != 0:
        raise AssertionError(f"the first command failed: {result}")
    return sandbox


def _sequential(make_env: Callable[[], Env], n: int) -> list[float]:
    envs = [make_env() for _ in range(n)]
    try:
        return [_timed_start(env) for env in envs]
    finally:
        for env in envs:
            env.close()


def _burst(make_env: Callable[[], Env], n: int) -> list[float]:
    envs = [make_env() for _ in range(n)]
    barrier = threading.Barrier(n)
    samples: list[float] = [0.0] * n
    errors: list[BaseException] = []

    def start(index: int) -> None:
        try:
            barrier.wait()
            samples[index] = _timed_start(envs[index])
        except BaseException as exc:  # reported after the join, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,), name=f"burst-{i}") for i in range(n)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for env in envs:
            env.close()
    if errors:
        raise errors[0]
    return samples


def _timed_start(env: Env) -> float:
    """reset() and one ``true`` step, in milliseconds; an unscored start is an error, not a sample."""
    started = time.perf_counter_ns()
    env.reset()
    _, _, _, truncated, info = env.step("true")
    elapsed = (time.perf_counter_ns() - started) / 1e6
    if truncated or info.get("infra_error"):
        raise AssertionError(f"a start failed: {info.get('infra_error') or info.get('end_reason')}")
    return elapsed
