"""Durable: what a killed runner costs, going on from a checkpoint against playing the episode again.

Method:
    A scripted agent (``agent=replay``) plays one ``steps``-step episode of the
    trivial task: every step but the last sleeps ``step_s`` seconds in the
    sandbox and appends its number to a file (a stand-in for what a step costs:
    the model's answer and the command), and the last step solves the task. A
    runner (``python -m benchmarks.run``, a process of its own, with this
    run's ``backend`` and ``pool`` overrides) plays it with checkpoints every
    ``checkpoint_every`` steps, and is killed with SIGKILL (its whole process
    group) once its journal holds step ``killed_at``. A second runner then
    resumes the run (``resume=true``); its wall time, process start included,
    is the sample of ``recover_from_checkpoint``. The baseline,
    ``recover_from_start``, is the same with checkpoints never due
    (``checkpoint_every`` = ``steps`` + 1: every step is journalled, so the kill
    lands at the same step, and the resume plays the episode from its start,
    as a run without checkpoints does). The two are interleaved, one of each
    per repetition, so they share the machine's noise.

    Every resumed episode must score 1.0 and end with the same ``end_digest``
    (the files, byte for byte) as every other; one that does not stops the
    scenario, since a fast resume to a wrong state is no resume. Reported: the
    two recoveries' percentiles and the ratio of their medians, the steps each
    played again (``steps_replayed``) and where it went on from
    (``resumed_from_step``), and a checkpoint's median cost (``checkpoint_s``
    over ``checkpoints`` of the resumed attempts).

    The backend decides what survives the kill: the local backend's checkpoints
    are in its store on disk, Docker's are images labelled with the run (which
    the resume adopts and removes when it ends). A backend whose checkpoints do
    not survive falls back to the start, and ``resume_failed`` says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.episodes.recording import episodefiles
from benchmarks.episodes.recording.ledger import LEDGER_FILE
from benchmarks.job import Job, top_level_key
from benchmarks.reports.report import Report
from benchmarks.reports.stats import percentile
from benchmarks.scenarios.throughput import TRIVIAL_TASK
from pool.errors import ConfigError, SnapgymError

REPO = Path(__file__).resolve().parents[2]
PASSED_ON = ("backend", "pool")
"""The top-level keys of this run's overrides that its runners get too (where and how sandboxes run)."""
ARMS = ("recover_from_checkpoint", "recover_from_start")


@dataclass
class DurableBenchConfig:
    """Recovery after a runner kill: from the last checkpoint against from the start."""

    name: str = "durable"
    """Scenario name."""
    steps: int = 50
    """Steps of the scripted episode (the last one solves the task)."""
    checkpoint_every: int = 10
    """Checkpoint policy of the ``recover_from_checkpoint`` runs."""
    killed_at: int = 35
    """The runner is killed once its journal holds this step."""
    step_s: float = 0.5
    """Seconds every step but the last spends in the sandbox (a fast model call and a command)."""
    repetitions: int = 3
    """Kills and recoveries per arm."""
    timeout_s: float = 600.0
    """Longest a runner may take before the scenario gives up on it."""


def run(job: Job) -> Report:
    """Kill and resume runners; see the module docstring."""
    cfg: DurableBenchConfig = job.settings
    _check(cfg)
    work = job.output_dir / "runs"
    actions = _write_actions(job.output_dir / "actions.jsonl", cfg)
    passed_on = [override for override in job.overrides if top_level_key(override) in PASSED_ON]
    every = {"recover_from_checkpoint": cfg.checkpoint_every, "recover_from_start": cfg.steps + 1}
    samples: dict[str, list[float]] = {arm: [] for arm in ARMS}
    results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for repetition in range(cfg.repetitions):
        for arm in ARMS:
            runner = _Runner(work / f"{arm}-{repetition}", passed_on, cfg.timeout_s)
            runner.play_until_killed(["agent=replay", f"agent.path={actions}", f"checkpoint_every={every[arm]}"],
                                     cfg.killed_at)  # fmt: skip
            seconds, result = runner.resume()
            samples[arm].append(seconds * 1000)
            results[arm].append(result)
    _check_outcomes(results)
    medians = {arm: percentile(samples[arm], 50) for arm in ARMS}
    speedup = medians["recover_from_start"] / medians["recover_from_checkpoint"]
    resumed = results["recover_from_checkpoint"]
    per_checkpoint = [r["checkpoint_s"] / r["checkpoints"] * 1000 for r in resumed if r.get("checkpoints")]
    headline = {"checkpoint_ms": percentile(per_checkpoint, 50) if per_checkpoint else None}
    meta = {
        "backend": str(job.config.backend.name),
        "steps": cfg.steps, "checkpoint_every": cfg.checkpoint_every, "killed_at": cfg.killed_at, "step_s": cfg.step_s,
        **{f"{arm}_resumed_from_step": [r.get("resumed_from_step") for r in results[arm]] for arm in ARMS},
        **{f"{arm}_steps_replayed": [r.get("steps_replayed") for r in results[arm]] for arm in ARMS},
        "resume_failed": sorted({r["resume_failed"] for r in resumed if r.get("resume_failed")}),
        **headline,
    }  # fmt: skip
    return Report("durable", samples, ratios={"from_start_vs_from_checkpoint": speedup}, meta=meta,
                  headline=headline)  # fmt: skip


def _check(cfg: DurableBenchConfig) -> None:
    if not 1 <= cfg.checkpoint_every <= cfg.killed_at < cfg.steps:
        raise ConfigError(
            "benchmark.checkpoint_every <= benchmark.killed_at < benchmark.steps must hold, with checkpoint_every >= 1 "
            f"(got {cfg.checkpoint_every}, {cfg.killed_at}, {cfg.steps}): the kill must come after a checkpoint "
            "and before the episode ends"
        )
    if cfg.repetitions < 1 or cfg.step_s < 0 or cfg.timeout_s <= 0:
        raise ConfigError("benchmark.repetitions must be >= 1, step_s >= 0 and timeout_s > 0")


def _write_actions(path: Path, cfg: DurableBenchConfig) -> Path:
    """The scripted episode: ``steps`` - 1 slow steps that leave a trace, then the solution."""
    steps = [f"sleep {cfg.step_s:g}; echo {n} >> /app/steps.txt" for n in range(1, cfg.steps)]
    steps.append("echo ok > /app/answer.txt")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"action": action}) + "\n" for action in steps))
    return path


def _check_outcomes(results: dict[str, list[dict[str, Any]]]) -> None:
    """Every resumed episode scored 1.0 and ended with the same files; else the figures mean nothing."""
    every = [r for arm in ARMS for r in results[arm]]
    wrong = [r for r in every if r.get("outcome") != "scored" or r.get("reward") != 1.0 or not r.get("end_digest")]
    if wrong:
        raise AssertionError(f"a resumed episode did not score 1.0: {[_brief(r) for r in wrong]}")
    digests = {r["end_digest"] for r in every}
    if len(digests) != 1:
        raise AssertionError(f"resumed episodes ended in different states: {sorted(digests)}")


def _brief(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("outcome", "reward", "end_reason", "error", "resumed_from_step", "resume_failed")
    return {key: result.get(key) for key in keys}


class _Runner:
    """``python -m benchmarks.run`` on the trivial task into one run directory, as a process of its own."""

    def __init__(self, run_dir: Path, passed_on: list[str], timeout_s: float) -> None:
        self.run_dir = run_dir
        self.passed_on = passed_on
        self.timeout_s = timeout_s
        self.launches = 0

    def play_until_killed(self, overrides: list[str], step: int) -> None:
        """Start a run and SIGKILL its process group once its journal holds ``step``."""
        journal = self.run_dir / episodefiles.journal_file(TRIVIAL_TASK.name, 0)
        process, log = self._start(overrides)
        try:
            deadline = time.monotonic() + self.timeout_s
            while not _journalled(journal, step):
                if process.poll() is not None:
                    raise RunnerFailedError(f"the runner ended before step {step} was journalled", log)
                if time.monotonic() > deadline:
                    raise RunnerFailedError(f"step {step} was not journalled within {self.timeout_s:g} s", log)
                time.sleep(0.01)
        finally:
            _kill(process)

    def resume(self) -> tuple[float, dict[str, Any]]:
        """Resume the run to its end: its wall time in seconds, and the episode's result."""
        started = time.perf_counter()
        process, log = self._start(["resume=true"])
        try:
            code = process.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill(process)
            raise RunnerFailedError(f"the resumed runner did not finish within {self.timeout_s:g} s", log) from None
        seconds = time.perf_counter() - started
        if code != 0:
            raise RunnerFailedError(f"the resumed runner exited {code}", log)
        records = [json.loads(line) for line in (self.run_dir / LEDGER_FILE).read_text().splitlines()]
        (result,) = [record for record in records if record.get("kind") == "result"]
        return seconds, result

    def _start(self, overrides: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        self.launches += 1
        log = self.run_dir.parent / f"{self.run_dir.name}-runner{self.launches}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "benchmarks.run", "suite=dir", f"suite.path={TRIVIAL_TASK.parent}",
            f"suite.include=[{TRIVIAL_TASK.name}]", f"output_dir={self.run_dir}",
            f"hydra.run.dir={self.run_dir.parent / (self.run_dir.name + '-hydra')}", "progress=false",
            "benchmark.plots=false", *self.passed_on, *overrides,
        ]  # fmt: skip
        with log.open("w") as out:
            process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return process, log


class RunnerFailedError(SnapgymError):
    """A runner the scenario started failed; the message ends with the last line it printed (its error)."""

    def __init__(self, what: str, log: Path) -> None:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.exists() else []
        said = f": {lines[-1].strip()}" if lines else ""
        super().__init__(f"{what}{said} (its output: {log})")


def _kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a runner's process group (it may have ended already) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _journalled(journal: Path, step: int) -> bool:
    """Whether the journal holds a step record of ``step`` (a line cut by a write in progress is skipped)."""
    try:
        text = journal.read_text()
    except FileNotFoundError:
        return False
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("type") == "step" and record.get("step") == step:
            return True
    return False
