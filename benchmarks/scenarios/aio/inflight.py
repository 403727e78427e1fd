"""Episodes in flight: ``envs.aio.rollout`` on one event loop against ``envs.rollout``'s threads.

Method:
    One group of N episodes of the trivial task (``benchmarks/tasks/trivial``), for each N in
    ``in_flight`` (default 64 and 256): every episode forks from the task's snapshot, runs
    ``steps`` commands (the first solves the task, the rest are ``true``), submits, and the
    verifier scores it. Before every action the policy "thinks" for ``think_s`` seconds, a stand-in
    for a call to an inference server: ``time.sleep`` in the thread-based rollout (a thread per
    episode, as ``envs.rollout`` plays a group of k = N), ``await asyncio.sleep`` in the async one
    (``envs.aio.rollout(k=N, max_in_flight=N)``: one event loop, and an executor of
    ``blocking_threads`` threads for resets, verifiers and closes). The two are interleaved,
    ``repetitions`` times per N, after one discarded warm-up round of each at the smallest N, so
    they share the machine's noise.

    Per round: episodes/s (N over the round's wall time), this process's CPU milliseconds per
    episode (``time.process_time``: the rollout's Python, which is where the two differ), the
    machine's CPU per episode (``/proc/stat``, sandboxes included), the peak of this process's
    threads and the peak of its resident memory above the round's start (``/proc/self/status``,
    sampled every 10 ms). Reported: each figure's median over the rounds per mode and N, and the
    async / threads ratio of the medians. Every episode must score 1.0; a round where one does not
    stops the scenario. ``samples.csv`` holds each round's wall time per episode (ms).

    The machine's CPU counts every process: on a machine that others keep busy it is about the
    cores times the wall time, and says nothing of the rollout; read this process's CPU then.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import envs
import envs.aio
from benchmarks.job import Job
from benchmarks.reports.report import Report
from benchmarks.scenarios.eval import open_supply
from benchmarks.scenarios.measure.cpuclock import MachineCPU
from benchmarks.scenarios.throughput import TRIVIAL_TASK, episode_actions
from envs.tasks import load_task
from pool.errors import ConfigError

MODES = ("threads", "async")


@dataclass
class AioBenchConfig:
    """Async rollouts against thread-based ones, by episodes in flight."""

    name: str = "aio"
    """Scenario name."""
    in_flight: list[int] = field(default_factory=lambda: [64, 256])
    """Episodes in flight at once (the group size of each round)."""
    repetitions: int = 3
    """Rounds per mode and number in flight (interleaved)."""
    steps: int = 3
    """Commands per episode before the submit."""
    think_s: float = 0.05
    """The policy's time per action (a model call's stand-in): sleep in threads, await in async."""
    blocking_threads: int = 16
    """Threads of the async rollout's executor (resets, verifiers, closes), fixed whatever the number in flight."""


@dataclass(frozen=True, slots=True)
class Round:
    """One round's figures."""

    episodes_per_s: float
    wall_ms_per_episode: float
    process_cpu_ms_per_episode: float
    machine_cpu_ms_per_episode: float
    peak_threads: int
    peak_rss_mib: float


def run(job: Job) -> Report:
    """Rounds of both rollouts at each number in flight; see the module docstring."""
    cfg: AioBenchConfig = job.settings
    if not cfg.in_flight or min(cfg.in_flight) < 1 or min(cfg.repetitions, cfg.steps, cfg.blocking_threads) < 1:
        raise ConfigError("benchmark.in_flight must be positive numbers; repetitions, steps, blocking_threads >= 1")
    if cfg.think_s < 0:
        raise ConfigError(f"benchmark.think_s must be >= 0, got {cfg.think_s}")
    supply = open_supply(job, job.config)
    env = supply.make_env("snapgym/Shell-v0", load_task(TRIVIAL_TASK), max_steps=cfg.steps + 1)
    rounds: dict[str, list[Round]] = {}
    blocking = envs.aio.Blocking(cfg.blocking_threads)
    try:
        with MachineCPU() as cpu:
            smallest = min(cfg.in_flight)
            for mode in MODES:  # warm-up, discarded
                _round(env, mode, smallest, cfg, cpu, blocking)
            for n in sorted(set(cfg.in_flight)):
                for _ in range(cfg.repetitions):
                    for mode in MODES:
                        rounds.setdefault(f"{mode}_{n}", []).append(_round(env, mode, n, cfg, cpu, blocking))
    finally:
        env.close()
        supply.close()
        blocking.close()
    return _report(cfg, rounds)


def _round(env: Any, mode: str, n: int, cfg: AioBenchConfig, cpu: MachineCPU, blocking: envs.aio.Blocking) -> Round:
    actions = [*episode_actions(cfg.steps), envs.SUBMIT]
    with _Peaks() as peaks:
        started, started_cpu = time.time(), time.process_time()
        if mode == "threads":
            groups = envs.rollout(env, _thread_policy(actions, cfg.think_s), k=n)
        else:
            policy = _async_policy(actions, cfg.think_s)
            groups = asyncio.run(envs.aio.rollout(env, policy, k=n, max_in_flight=n, blocking=blocking))
        ended, ended_cpu = time.time(), time.process_time()
    time.sleep(0.1)  # the CPU clock's next sample lies past the round's end
    rewards = [episode.reward for group in groups for episode in group.episodes]
    if len(rewards) != n or any(reward != 1.0 for reward in rewards):
        raise AssertionError(f"{mode} round of {n}: not every episode scored 1.0 ({sorted(rewards)[:5]}...)")
    wall = ended - started
    return Round(
        episodes_per_s=n / wall,
        wall_ms_per_episode=1000 * wall / n,
        process_cpu_ms_per_episode=1000 * (ended_cpu - started_cpu) / n,
        machine_cpu_ms_per_episode=1000 * cpu.between(started, ended).busy_s / n,
        peak_threads=peaks.threads,
        peak_rss_mib=peaks.rss_mib,
    )


def _thread_policy(actions: list[str], think_s: float) -> Callable[[dict[str, Any], dict[str, Any]], str]:
    def policy(observation: dict[str, Any], info: dict[str, Any]) -> str:
        time.sleep(think_s)
        return actions[int(info.get("step", 0))]

    return policy


def _async_policy(actions: list[str], think_s: float) -> envs.aio.AsyncPolicy:
    async def policy(observation: dict[str, Any], info: dict[str, Any]) -> str:
        await asyncio.sleep(think_s)
        return actions[int(info.get("step", 0))]

    return policy


class _Peaks:
    """The peak of this process's threads and of its resident memory above the start, sampled every 10 ms."""

    def __init__(self) -> None:
        self.threads, self.rss_mib = 0, 0.0
        self._start_kib = _status("VmRSS")
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._run, name="snapgym-peaks", daemon=True)

    def __enter__(self) -> _Peaks:
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sampler.join()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.threads = max(self.threads, _status("Threads") - 1)  # less the sampler itself
            self.rss_mib = max(self.rss_mib, (_status("VmRSS") - self._start_kib) / 1024)


def _status(key: str) -> int:
    """A number from /proc/self/status (kB for memory)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    return 0


def _report(cfg: AioBenchConfig, rounds: dict[str, list[Round]]) -> Report:
    fields = [name for name in Round.__slots__ if name != "wall_ms_per_episode"]
    medians: dict[str, float] = {}
    for key, samples in rounds.items():
        for name in fields:
            medians[f"{key}_{name}"] = float(statistics.median(getattr(r, name) for r in samples))
    ratios: dict[str, float | None] = {}
    for n in sorted(set(cfg.in_flight)):
        for name in fields:
            threads, asynchronous = medians[f"threads_{n}_{name}"], medians[f"async_{n}_{name}"]
            ratios[f"async_over_threads_{n}_{name}"] = asynchronous / threads if threads else None
    methods = {key: [r.wall_ms_per_episode for r in samples] for key, samples in rounds.items()}
    meta = {"in_flight": sorted(set(cfg.in_flight)), "repetitions": cfg.repetitions, "steps": cfg.steps,
            "think_s": cfg.think_s, "blocking_threads": cfg.blocking_threads,
            "unit": "methods: wall ms per episode of each round"}  # fmt: skip
    return Report("aio", methods, ratios=ratios, meta=meta, headline=dict(medians))
