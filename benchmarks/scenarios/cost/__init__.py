"""Cost: where the machine's CPU goes in a strict episode of the throughput benchmark's trivial task.

Method:
    The episode is throughput's (:mod:`benchmarks.scenarios.throughput`): a
    reset, ``steps`` steps (the first solves the task, the others are ``true``),
    a submit and the strict verifier. Five segments are measured, each as a
    whole over ``episodes`` episodes, in ``rounds`` rounds whose order rotates
    (baseline and candidate interleaved, so a neighbour's load falls on all):

    ``reset``           ``env.reset()`` only, sequentially
    ``reset+steps``     a reset and the steps
    ``reset+steps+seal`` and ``begin_verification`` (strict: the agent killed, the verifier's instance made)
    ``episode (env)``   a reset, the steps, the submit and the verifier: the env's whole episode
    ``episode (runner)`` the same through the runner at ``pool.size`` (ledger, episode files, pool), the
                        whole run: its pool started and closed, the task's calibration, its report
    ``episode (runner, steady)`` the same run between its first episode's start and its last one's end,
                        per episode that ended in between (what a long run costs per episode, as the
                        throughput benchmark's window counts it; see
                        :func:`~benchmarks.scenarios.cost.segments.steady_state`)
    ``baseline``        the no-isolation baseline (:mod:`benchmarks.scenarios.baselines.noisolation`)

    Differences of their medians give the phases: restore (the old instance
    killed, the spare swapped in, a new spare made and the old one torn down),
    the steps (the agent's shell), the seal (the agent's instance killed, the
    verifier's made), the verifier (the tests copied in, ``test.sh`` run, the
    reward and the end state read), and the runner. Each is split by process kind from
    ``/proc/<pid>/stat`` (:mod:`~benchmarks.scenarios.cost.accounting`: user and
    kernel time of the daemon, the keepers, their janitors, the instances, the
    runner's Python), which counts the run's own processes only, so another
    tenant's load on a shared machine changes it far less than it changes wall
    time or the machine-wide busy time (reported beside it). ``perf`` is not
    needed. In the same run, the kernel operations an instance is made of are
    timed one by one (:mod:`~benchmarks.scenarios.cost.kernelops`), and so is
    the runner's side of an egress gate, two of which a strict episode opens
    and closes (:mod:`~benchmarks.scenarios.cost.gateops`), and the
    host's memory cgroups are counted before and after each segment (dying
    ones included). Medians over the rounds; figures per episode. Needs
    ``pool=direct`` (Ray would run the episodes in other processes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

import envs
from benchmarks.agents import ReplayAgent
from benchmarks.episodes.recording import rundir
from benchmarks.episodes.recording.ledger import LEDGER_FILE, RESULT, read_records
from benchmarks.job import Job
from benchmarks.scenarios.baselines import noisolation
from benchmarks.scenarios.cost import report
from benchmarks.scenarios.cost.segments import SegmentCost, measure, sample, steady_state
from benchmarks.scenarios.eval import evaluate
from benchmarks.scenarios.throughput import TRIVIAL_TASK, episode_actions
from envs.tasks import Task, load_task
from envs.tasks.verifier import plan_for
from pool import ConfigError
from pool.verification import VerificationPlan

PLAYED = ("reset", "reset+steps", "reset+steps+seal", "episode (env)", "episode (runner)", "baseline")
"""The segments each round plays, in rotating order."""
STEADY = "episode (runner, steady)"
SEGMENTS = (*PLAYED[:5], STEADY, PLAYED[5])
"""Every segment reported: the played ones, and the runner's steady state (of the run ``episode (runner)`` played)."""


@dataclass
class CostConfig:
    """Machine CPU per strict episode of the trivial task, by phase and by process kind."""

    name: str = "cost"
    """Scenario name."""
    episodes: int = 100
    """Episodes per segment and round."""
    rounds: int = 3
    """Rounds of the six segments, in rotating order; medians over them."""
    steps: int = 3
    """Steps per episode, as throughput's."""
    kernel_op_repetitions: int = 300
    """Repetitions of each kernel operation (0: skip them)."""


@dataclass
class CostOutcome:
    """The per-round segment costs, the kernel operations, and the tables made of them."""

    rounds: list[list[SegmentCost]]
    kernel_ops: dict[str, dict[str, float]]
    machine: str
    method: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """summary.json's content: medians by segment and phase, every round, the kernel operations."""
        return report.summary(self.rounds, self.kernel_ops, self.machine, self.method)

    def write(self, output_dir: Path) -> Path:
        """summary.json and cost.md; returns summary.json's path."""
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "cost.md").write_text(self.table() + "\n")
        path = output_dir / "summary.json"
        path.write_text(json.dumps(self.summary(), indent=2) + "\n")
        return path

    def table(self) -> str:
        """The markdown tables: by phase and kind, the segments, the kernel operations."""
        return report.markdown(self.summary())


def run(job: Job) -> CostOutcome:
    """Measure the segments ``rounds`` times and the kernel operations; see the module docstring."""
    cfg: CostConfig = job.settings
    if str(getattr(job.config.pool.kind, "name", job.config.pool.kind)) != "direct":
        raise ConfigError("benchmark=cost accounts for the runner's own processes; run it with pool=direct")
    run_dir, config, _ = rundir.resolve(job.config, job.output_dir, given=job.given)
    task = load_task(TRIVIAL_TASK)
    actions = episode_actions(cfg.steps)
    config = config.copy()
    config.max_steps, config.pass_at_k, config.suite.name = cfg.steps + 1, [1], task.id
    config.progress = False
    size = int(config.pool.size)
    env = gym.make("snapgym/Shell-v0", task=str(task.path), backend=job.backend, max_steps=cfg.steps + 1)
    try:
        _play(env, actions, 5, submit=True)  # warm: the snapshot built, the spare made

        def runner(round_index: int) -> None:
            config.episodes_per_task = cfg.episodes
            agent = ReplayAgent(actions=actions)
            evaluate(job, config, run_dir / f"round{round_index}", [task], agent, resumed=False, plots=False)

        rounds = [_round(r, cfg, env, actions, task, size, run_dir, runner) for r in range(cfg.rounds)]
    finally:
        env.close()
    kernel_ops, note = _kernel_ops(cfg.kernel_op_repetitions)
    method: dict[str, Any] = {"episodes": cfg.episodes, "rounds": cfg.rounds, "steps": cfg.steps, "pool_size": size}
    if note:
        method["kernel_ops_note"] = note
    outcome = CostOutcome(rounds, kernel_ops, machine(), method)
    outcome.write(run_dir)
    return outcome


def _round(
    index: int, cfg: CostConfig, env: gym.Env[Any, Any], actions: list[str], task: Task, size: int,
    run_dir: Path, runner: Callable[[int], None],
) -> list[SegmentCost]:  # fmt: skip
    n = cfg.episodes
    plays: dict[str, Callable[[], object]] = {
        "reset": lambda: _play(env, [], n, submit=False),
        "reset+steps": lambda: _play(env, actions, n, submit=False),
        "reset+steps+seal": lambda: _play(env, actions, n, submit=False, seal=plan_for(task)),
        "episode (env)": lambda: _play(env, actions, n, submit=True),
        "baseline": lambda: noisolation.episodes_per_s(
            task.path, actions, episodes=n, concurrency=size, scratch=run_dir
        ),
    }
    order = PLAYED[index % len(PLAYED) :] + PLAYED[: index % len(PLAYED)]
    measured: dict[str, SegmentCost] = {}
    for name in order:
        if name != "episode (runner)":
            measured[name] = measure(name, n, plays[name])
            continue
        sampled = sample(lambda: runner(index))
        measured[name] = sampled.cost(name, n)
        steady = steady_state(STEADY, sampled, _episode_times(run_dir / f"round{index}"))
        measured[STEADY] = steady if steady is not None else sampled.cost(STEADY, n)
    return [measured[name] for name in SEGMENTS]


def _episode_times(run: Path) -> list[tuple[float, float]]:
    """Each result's ``(started_at, finished_at)`` in a run's ledger."""
    return [(float(r["started_at"]), float(r["finished_at"])) for r in read_records(run / LEDGER_FILE)
            if r.get("kind") == RESULT]  # fmt: skip


def _play(
    env: gym.Env[Any, Any], actions: list[str], episodes: int, *, submit: bool, seal: VerificationPlan | None = None
) -> None:
    for _ in range(episodes):
        env.reset()
        for action in actions:
            env.step(action)
        if seal is not None:
            sandbox = env.unwrapped.sandbox  # type: ignore[attr-defined]
            sandbox.begin_verification(seal)  # the next reset ends it
        if submit:
            _, reward, *_ = env.step(envs.SUBMIT)
            if reward != 1.0:
                raise AssertionError(f"a cost episode scored {reward}, not 1: the segments would not do the same work")


def _kernel_ops(repetitions: int) -> tuple[dict[str, dict[str, float]], str]:
    """The operations' CPU (see kernelops), and why there are none when there are none."""
    if repetitions <= 0:
        return {}, "not measured (kernel_op_repetitions=0)"
    if os.geteuid() != 0:
        return {}, "not measured: they need root"
    result: dict[str, dict[str, float]] = {}
    for command in (
        [sys.executable, "-I", str(Path(__file__).with_name("kernelops.py")), str(repetitions)],
        [sys.executable, "-m", "benchmarks.scenarios.cost.gateops", str(repetitions)],
        [sys.executable, "-m", "benchmarks.scenarios.cost.floorops", str(repetitions)],
    ):
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
        if done.returncode != 0:
            return result, f"failed: {done.stderr.strip()[-300:]}"
        result.update(json.loads(done.stdout))
    return result, ""


def machine() -> str:
    """This machine in words: its CPUs, kernel and mounts (results name the machine beside every figure).

    The host's mounts are named because a container runtime copies them into every instance; the
    local backend's daemon drops those no sandbox reaches (``sandboxd/hostmounts.c``)."""
    model = "unknown CPU"
    with open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
        count = sum(1 for _ in mounts)
    return f"{os.cpu_count()} CPUs ({model}), Linux {os.uname().release}, {count} mounts"
