"""Idle: the first command after a sandbox sat idle, against a warm one.

Method:
    Agents think between commands, for seconds to minutes, and a sandbox that
    sat still can come back slowly: its pages reclaimed or swapped, its
    processes' caches cold (peers measured 2x after 60 s). ``sandboxes``
    environments of the trivial task are reset (untimed); each then steps
    ``true`` ``warm_steps`` times, one environment after another (timed:
    ``warm``). All then sit for ``idle_s`` seconds; then each steps ``true``
    once, one after another (timed: ``after_idle``); the task's agent time
    limit is lifted, so the idle period does not end the episodes. The ratio of the medians
    is the cost of idleness; ``rounds`` repeats the idle period and its
    first commands. On ``pool=ray`` the steps go through the pool's leases.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.job import Job
from benchmarks.reports.report import Report, Target
from benchmarks.reports.stats import percentile
from benchmarks.scenarios.eval import open_supply
from benchmarks.scenarios.throughput import TRIVIAL_TASK
from benchmarks.schemas import PoolKind
from envs.tasks import load_task
from pool.errors import ConfigError


@dataclass
class IdleConfig:
    """The first command after an idle period, against warm commands."""

    name: str = "idle"
    """Scenario name."""
    sandboxes: int = 8
    """Environments (each its own sandbox) measured."""
    warm_steps: int = 10
    """Timed ``true`` steps per environment before the idle period."""
    idle_s: float = 60.0
    """How long every sandbox sits idle."""
    rounds: int = 1
    """Idle periods, each followed by one timed step per environment."""
    target_ratio: float = 1.5
    """after_idle p50 / warm p50, reported as met or missed."""


def run(job: Job) -> Report:
    """Time warm steps and the first step after idling; see the module docstring."""
    cfg: IdleConfig = job.settings
    if cfg.sandboxes < 1 or cfg.warm_steps < 1 or cfg.rounds < 1 or cfg.idle_s < 0:
        raise ConfigError("benchmark.sandboxes, warm_steps and rounds must be >= 1, and idle_s >= 0")
    supply = open_supply(job, job.config)
    trivial = load_task(TRIVIAL_TASK)  # without its agent time limit, which an idle period would pass
    task = dataclasses.replace(trivial, settings=dataclasses.replace(trivial.settings, agent_timeout_s=None))
    envs = [supply.make_env("snapgym/Shell-v0", task, max_steps=10**6) for _ in range(cfg.sandboxes)]
    try:
        for env in envs:
            env.reset(seed=0)
            _step_ms(env)  # the first step of an episode is not a warm one
        warm = [_step_ms(env) for _ in range(cfg.warm_steps) for env in envs]
        after_idle: list[float] = []
        for _ in range(cfg.rounds):
            time.sleep(cfg.idle_s)
            after_idle += [_step_ms(env) for env in envs]
    finally:
        for env in envs:
            env.close()
        supply.close()
    ratio = percentile(after_idle, 50) / percentile(warm, 50)
    target = Target("idle_ratio", f"first command after {cfg.idle_s:g} s idle / warm p50 <= {cfg.target_ratio:g}",
                    cfg.target_ratio, ratio)  # fmt: skip
    meta = {"pool": PoolKind(job.config.pool.kind).value, "idle_s": cfg.idle_s, "sandboxes": cfg.sandboxes}
    return Report("idle", {"warm": warm, "after_idle": after_idle}, ratios={"after_idle_vs_warm": ratio},
                  targets=[target], meta=meta)  # fmt: skip


def _step_ms(env: Any) -> float:
    """One ``true`` step, in milliseconds; a failed step is an error, not a sample."""
    started = time.perf_counter_ns()
    obs, _, _, truncated, info = env.step("true")
    elapsed = (time.perf_counter_ns() - started) / 1e6
    if truncated or int(obs["exit_code"]) != 0:
        raise AssertionError(f"a step failed: {info.get('infra_error') or obs['output']}")
    return elapsed
