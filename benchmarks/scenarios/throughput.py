"""Throughput: complete episodes per second as the number of concurrent episodes grows.

Method:
    One trivial task (``benchmarks/tasks/trivial``: the verifier checks a
    file) and a replay agent whose first action solves it (``echo ok >
    /app/answer.txt``) and whose other ``steps - 1`` are ``true``, so an episode is
    a reset, ``steps`` steps, a submit and the verifier: what every episode
    costs beyond the agent's own thinking. The episodes run through the real
    runner (the ledger is written and fsync-ed per record, as in an eval),
    ``pool.size`` at a time, on the configured pool (``direct`` or ``ray``).
    First ``warmup_episodes`` are run and discarded (in their own ledger under
    ``warmup/``); then ``episodes`` are timed. Throughput is the number of
    finished episodes divided by the wall time from the first episode's start
    to the last one's end; episode and reset latency percentiles come from the
    ledger (numpy, linear interpolation). Sweep the size with Hydra's
    multirun: ``-m benchmark=throughput pool.size=1,2,4,8``.

    In the same run, unless ``baseline=false``, the no-isolation baseline
    (:mod:`benchmarks.scenarios.baselines.noisolation`) plays the same number of episodes, the same
    actions and verifier as plain subprocesses in scratch folders, ``pool.size``
    at a time: what running the commands at all costs on this machine. The
    ratio baseline / snapgym is the price of isolation, snapshots and a
    verifier the agent cannot reach.

    Both also report the machine-wide CPU milliseconds per episode over the
    timed window (:mod:`benchmarks.scenarios.measure.cpuclock`): every process's busy time, Ray's
    daemons and the sandboxes included, with the hypervisor's steal beside it.
    On a shared VM episodes/s swing with the host's load; CPU per episode
    measures the work, so compare that first.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.agents import ReplayAgent
from benchmarks.episodes.recording import rundir
from benchmarks.episodes.recording.rundir import SUMMARY_FILE
from benchmarks.job import Job
from benchmarks.reports import results
from benchmarks.scenarios.baselines import noisolation
from benchmarks.scenarios.eval import EvalOutcome, evaluate
from benchmarks.scenarios.measure.cpuclock import MachineCPU
from envs.tasks import load_task

TRIVIAL_TASK = Path(__file__).resolve().parents[1] / "tasks" / "trivial"


@dataclass
class ThroughputConfig:
    """Complete episodes per second of a trivial task."""

    name: str = "throughput"
    """Scenario name."""
    task: str | None = None
    """A task directory; None: the trivial task shipped in benchmarks/tasks."""
    episodes: int = 400
    """Timed episodes."""
    warmup_episodes: int = 20
    """Episodes run first and discarded."""
    steps: int = 3
    """Steps per episode (``true``), before the submit."""
    target_episodes_per_s: float = 100.0
    """Reported as met or missed."""
    plots: bool = True
    """Write the PNG plots."""
    baseline: bool = True
    """Also measure the no-isolation baseline (plain subprocesses), in the same run."""
    target_baseline_ratio: float = 1.5
    """baseline episodes/s over snapgym's, reported as met or missed."""


@dataclass
class ThroughputOutcome:
    """An eval-style outcome plus the throughput target."""

    evaluation: EvalOutcome

    def write(self, output_dir: Path) -> Path:
        """summary.json is already written; returns its path."""
        return self.evaluation.write(output_dir)

    def table(self) -> str:
        """The run's table, the baseline and the target lines."""
        lines = [self.evaluation.table()]
        baseline = self.evaluation.summary.get("baseline")
        cpu = self.evaluation.summary["throughput"].get("cpu")
        if cpu:
            lines.append(_cpu_line("snapgym", cpu))
        if baseline:
            lines.append(f"no-isolation baseline: {baseline['episodes_per_s']:.1f} episodes/s (plain subprocesses)")
            if baseline.get("cpu"):
                lines.append(_cpu_line("baseline", baseline["cpu"]))
        for target in self.evaluation.summary["targets"].values():
            verdict = {True: "met", False: "MISSED", None: "n/a"}[target["met"]]
            value = "-" if target["value"] is None else f"{target['value']:.2f}"
            lines.append(f"target {target['description']}: {value}  {verdict}")
        return "\n".join(lines)


def run(job: Job) -> ThroughputOutcome:
    """Measure throughput at ``pool.size``; see the module docstring."""
    cfg: ThroughputConfig = job.settings
    run_dir, config, _ = rundir.resolve(job.config, job.output_dir, given=job.given)
    task = load_task(cfg.task or TRIVIAL_TASK)
    agent = ReplayAgent(actions=episode_actions(cfg.steps))
    config = config.copy()
    config.max_steps = cfg.steps + 1
    config.pass_at_k = [1]
    config.suite.name = task.id
    if cfg.warmup_episodes:
        config.episodes_per_task = cfg.warmup_episodes
        warm = config.copy()
        warm.progress = False
        evaluate(job, warm, run_dir / "warmup", [task], agent, resumed=False, plots=False)
    config.episodes_per_task = cfg.episodes
    with MachineCPU() as cpu:
        outcome = evaluate(job, config, run_dir, [task], agent, resumed=False, plots=cfg.plots)
    rate = outcome.summary["throughput"]["episodes_per_s"]
    outcome.summary["throughput"]["cpu"] = _cpu_per_episode(cpu, *_episode_window(run_dir), cfg.episodes)
    outcome.summary["targets"] = {"episodes_per_s": _target(rate, cfg.target_episodes_per_s)}
    if cfg.baseline:
        with MachineCPU() as cpu:
            started = time.time()
            baseline = noisolation.episodes_per_s(
                task.path, episode_actions(cfg.steps), episodes=cfg.episodes,
                concurrency=int(config.pool.size), scratch=run_dir,
            )  # fmt: skip
            ended = time.time()
        ratio = baseline / rate if rate else None
        outcome.summary["baseline"] = {"episodes_per_s": baseline, "ratio": ratio,
                                       "cpu": _cpu_per_episode(cpu, started, ended, cfg.episodes)}  # fmt: skip
        outcome.summary["targets"]["baseline_ratio"] = _target(ratio, cfg.target_baseline_ratio, at_most=True)
    outcome.summary["method"] = {"steps": cfg.steps, "warmup_episodes": cfg.warmup_episodes, "task": task.id}
    (run_dir / SUMMARY_FILE).write_text(json.dumps(outcome.summary, indent=2) + "\n")
    return ThroughputOutcome(outcome)


def _cpu_line(who: str, cpu: dict[str, float]) -> str:
    return (
        f"{who}: {cpu['busy_ms_per_episode']:.1f} ms of machine CPU per episode "
        f"({cpu['cores_busy']:.2f} cores busy; {cpu['steal_ms_per_episode']:.1f} ms/episode stolen by the hypervisor)"
    )


def episode_actions(steps: int) -> list[str]:
    """``steps`` actions: the first solves the trivial task, the rest are ``true``."""
    return ["echo ok > /app/answer.txt", *["true"] * (steps - 1)][:steps]


def _episode_window(run_dir: Path) -> tuple[float, float]:
    """Wall-clock start of the run's first episode and end of its last, from the ledger."""
    frame, _ = results.read_run(run_dir)
    return float(frame["started_at"].min()), float(frame["finished_at"].max())


def _cpu_per_episode(cpu: MachineCPU, start: float, end: float, episodes: int) -> dict[str, float]:
    """Machine-wide CPU milliseconds per episode in the window (busy and stolen), and cores kept busy."""
    window = cpu.between(start, end)
    return {
        "busy_ms_per_episode": 1000 * window.busy_s / episodes,
        "steal_ms_per_episode": 1000 * window.steal_s / episodes,
        "cores_busy": window.busy_s / window.wall_s,
    }


def _target(value: float | None, limit: float, *, at_most: bool = False) -> dict[str, Any]:
    description = f"no-isolation baseline / snapgym <= {limit:g}" if at_most else f"episodes/s >= {limit:g}"
    met = None if value is None else (value <= limit if at_most else value >= limit)
    return {"description": description, "limit": limit, "value": value, "met": met}
