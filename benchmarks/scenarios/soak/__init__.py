"""Soak: no slowdown with the work served (issue 34 item 5).

Method:
    ``episodes`` episodes (default 10,000) of the throughput benchmark's
    trivial task (:mod:`benchmarks.scenarios.throughput`: a reset, ``steps``
    steps whose first solves the task, a submit and the strict verifier) on
    one backend, ``pool.size`` at a time: one environment per worker thread,
    all on the job's one backend (its daemon serves every episode), after
    ``warmup_episodes`` discarded ones. The episodes are played in windows of
    ``window`` (default 1,000); each window reports the time to first command
    (from ``reset()`` to the first step's return) and the restore (the env's
    reset latency) at p50 and p99, the run's own CPU per episode by process
    kind (:mod:`benchmarks.scenarios.cost.accounting`, through the cost
    scenario's :func:`~benchmarks.scenarios.cost.segments.measure`), the
    machine's busy time, the runner's descendants by kind and its resident
    memory, and the host's memory cgroups half a second after its end (the
    last instances' cgroups freed): all of them (``num_cgroups`` in
    ``/proc/cgroups``, dying ones included), the live ones (directories of the
    hierarchy) and the local backend's instances'.

    Verdicts: the last window's time to first command p50, restore p50 and own
    CPU per episode each within ``tolerance`` (10%) of the first window's; and
    at no window's end more dying memory cgroups on the host (all of them less
    the live ones) than before the first window (after the warm-up) plus
    ``cgroup_multiple`` times the live sandboxes (``pool.size``): dying ones
    are what piles up, while the live ones come and go with other tenants'
    containers and sandboxes. p99s and the machine's busy time are reported as
    ratios too, not judged: on a shared machine they move with the other
    tenants. Unless ``fresh_control=false``, one more window is
    played right after the last on a fresh backend (a new daemon, the same
    warm-up): the last window against it takes out the machine's drift, which
    a neighbour's load brings and which no growth of the soaked backend
    explains (reported, not judged). Needs ``pool=direct`` (the episodes run
    in this process, whose descendants the accounting counts).
"""

from __future__ import annotations

import json
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from benchmarks.episodes.recording import rundir
from benchmarks.job import Job
from benchmarks.scenarios.cost import machine
from benchmarks.scenarios.cost.segments import memory_cgroups
from benchmarks.scenarios.soak import report
from benchmarks.scenarios.soak.windows import SETTLE_S, Window, live_memory_cgroups, play_episode, play_window
from benchmarks.scenarios.throughput import TRIVIAL_TASK, episode_actions
from envs.tasks import load_task
from pool import Backend, ConfigError


@dataclass
class SoakConfig:
    """Time to first command, restore, CPU per episode and memory cgroups over many episodes on one backend."""

    name: str = "soak"
    """Scenario name."""
    episodes: int = 10_000
    """Episodes measured, in windows of ``window``: a multiple of it, at least two windows."""
    window: int = 1_000
    """Episodes per window; the first window and the last are compared."""
    warmup_episodes: int = 20
    """Episodes played first and discarded (the snapshot built, every worker's sandbox and spare made)."""
    steps: int = 3
    """Steps per episode, as throughput's."""
    tolerance: float = 0.10
    """How much the last window's time to first command, restore (p50s) and CPU may exceed the first's."""
    cgroup_multiple: float = 4.0
    """Memory cgroups the host may gain over the soak, per live sandbox."""
    fresh_control: bool = True
    """After the last window, one more on a fresh backend (a new daemon): the last window against it tells
    the machine's drift (a neighbour's load) from the soaked backend's own."""


@dataclass
class SoakOutcome:
    """The windows and the verdicts made of them."""

    figures: dict[str, Any] = field(default_factory=dict)

    def write(self, output_dir: Path) -> Path:
        """summary.json and soak.md; returns summary.json's path."""
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "soak.md").write_text(self.table() + "\n")
        path = output_dir / "summary.json"
        path.write_text(json.dumps(self.figures, indent=2) + "\n")
        return path

    def table(self) -> str:
        """The window table and the verdicts."""
        return report.markdown(self.figures)


def run(job: Job) -> SoakOutcome:
    """Play the windows on one backend and judge the last against the first; see the module docstring."""
    cfg: SoakConfig = job.settings
    _check(cfg, job)
    run_dir, config, _ = rundir.resolve(job.config, job.output_dir, given=job.given)
    size = int(config.pool.size)
    before, windows = _serve(job.backend, cfg, size, cfg.episodes // cfg.window)
    control = _serve(job.open_backend(), cfg, size, 1, first_index=len(windows))[1][0] if cfg.fresh_control else None
    method = {"episodes": cfg.episodes, "window": cfg.window, "warmup_episodes": cfg.warmup_episodes,
              "steps": cfg.steps, "pool_size": size, "backend": str(config.backend.name)}  # fmt: skip
    figures = report.summary(
        windows, control, dying_before=before, live_sandboxes=size, tolerance=cfg.tolerance,
        cgroup_multiple=cfg.cgroup_multiple, machine=machine(), method=method,
    )  # fmt: skip
    outcome = SoakOutcome(figures)
    outcome.write(run_dir)
    return outcome


def _serve(
    backend: Backend, cfg: SoakConfig, size: int, count: int, *, first_index: int = 0
) -> tuple[int, list[Window]]:
    """``count`` windows on ``backend`` after a warm-up; the dying memory cgroups after the warm-up, and them."""
    actions = episode_actions(cfg.steps)
    task = load_task(TRIVIAL_TASK)
    environments: list[gym.Env[Any, Any]] = []
    pool: queue.Queue[gym.Env[Any, Any]] = queue.Queue()
    try:
        for _ in range(size):
            env = gym.make("snapgym/Shell-v0", task=str(task.path), backend=backend, max_steps=cfg.steps + 1)
            environments.append(env)
            pool.put(env)
        with ThreadPoolExecutor(max_workers=size, thread_name_prefix="snapgym-soak") as workers:
            for index in range(cfg.warmup_episodes):
                play_episode(environments[index % size], actions)
            time.sleep(SETTLE_S)
            before = memory_cgroups() - live_memory_cgroups()[0]
            return before, [play_window(first_index + i, cfg.window, workers, pool, actions) for i in range(count)]
    finally:
        for env in environments:
            env.close()


def _check(cfg: SoakConfig, job: Job) -> None:
    """Refuse settings that would not measure what the soak reports.

    Raises:
        ConfigError: a Ray pool, or episodes that are not at least two whole windows.
    """
    if str(getattr(job.config.pool.kind, "name", job.config.pool.kind)) != "direct":
        raise ConfigError("benchmark=soak accounts for the runner's own processes; run it with pool=direct")
    if cfg.window < 1 or cfg.episodes < 2 * cfg.window or cfg.episodes % cfg.window:
        raise ConfigError(
            f"benchmark.episodes={cfg.episodes} is not two or more whole windows of benchmark.window={cfg.window}: "
            "set episodes to a multiple of window, at least twice it (the first window is compared with the last)"
        )
    if cfg.tolerance < 0 or cfg.cgroup_multiple < 0:
        raise ConfigError("benchmark.tolerance and benchmark.cgroup_multiple must be zero or more")
