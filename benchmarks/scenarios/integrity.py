"""Integrity: play the catalogue of verifier attacks against a suite and check none beats doing nothing.

Method:
    The suite's tasks (the built-in suite by default, plus the catalogue's own
    target tasks when ``benchmark.targets``) are played in each verification
    mode of ``benchmark.modes`` (``strict`` and ``shared``: every task in
    both, whatever it declares, so each attack meets tasks of both kinds).
    In each mode the no-op agent plays every task first: that is the
    baseline. Then each attack of ``benchmark.attacks`` (default: the whole
    catalogue, ``benchmarks.attacks``) is played as a replay agent against
    the tasks it aims at. Every play is a normal evaluation through the
    runner (``benchmarks.scenarios.eval.evaluate``): its own ledger,
    episodes table and summary under ``<run>/<mode>/<agent>/``, so a run
    resumes where it stopped. Each task's verifier timeout is capped at
    ``benchmark.verifier_timeout_s``: an attack that stalls the verifier
    costs that long per episode, not the task's full budget.

    Verdict per attack and mode, on the tasks it aimed at: it *beats the
    no-op agent* when its mean reward (infrastructure failures left out, as
    in every summary) is above the no-op agent's mean on the same tasks, or
    when more of its episodes are unscored (``infra_error``) than the no-op
    agent's there, or when a play hung: no ledger record for
    ``benchmark.hang_timeout_s``, after which the play's sandboxes are closed
    (direct pool only) and what is left ends as infrastructure failures.
    Reported: per attack and mode the mean reward, scored and unscored
    counts, the baseline's, the verdict and the tasks it beat; and per task
    (an audit of a folder of your own tasks: ``suite=dir suite.path=DIR``)
    every attack that beat the no-op agent there, in which mode, with both
    rewards; summary.json holds the same (``verdicts``, ``by_task``) and
    ``passed``. A run in which any attack beats the no-op
    agent prints the table and a loud message, and exits with status 1.

    Known limitations: an attack with ``Attack.known_limitation`` (code the
    tests import, run in the verifier's process) beats a task by the task's
    design, not through snapgym. A play of one that beats the no-op agent by
    reward alone (no hang, no more unscored episodes: those stay failures)
    gets the verdict ``KNOWN LIMITATION``: it is listed apart
    (``known_limitations``), each task it beat is flagged with the
    limitation and its remedy (``by_task`` entries with ``by_design``), and
    it neither fails the run nor counts in ``beaten``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from benchmarks.agents import NoopAgent, ReplayAgent
from benchmarks.attacks import Attack, select_attacks, target_tasks, task_kinds
from benchmarks.episodes.attempt import INFRA_ERROR
from benchmarks.episodes.recording import rundir
from benchmarks.episodes.recording.ledger import LEDGER_FILE
from benchmarks.episodes.sources.suites import image_sources, select_tasks
from benchmarks.job import Job
from benchmarks.reports import results
from benchmarks.scenarios.eval import evaluate
from envs.tasks import Task
from pool.errors import ConfigError

EXIT_ATTACK_WON = 1
"""Exit status of a run in which an attack beat the no-op agent."""
NOOP = "noop"
_EPSILON = 1e-9

log = logging.getLogger(__name__)


@dataclass
class IntegrityBenchConfig:
    """Which attacks, against which tasks, in which verification modes."""

    name: str = "integrity"
    """Scenario name."""
    attacks: list[str] = field(default_factory=list)
    """Attack names from ``benchmarks.attacks``; empty: the whole catalogue."""
    modes: list[str] = field(default_factory=lambda: ["strict", "shared"])
    """Verification modes; every task is played in each."""
    targets: bool = True
    """Also play the catalogue's own target tasks (a Harbor-style pytest task)."""
    verifier_timeout_s: float = 15.0
    """Cap on each task's verifier timeout (the built-in verifiers take well under a second)."""
    hang_timeout_s: float = 60.0
    """A play with no ledger record for this long has hung: its sandboxes are closed."""


@dataclass
class IntegrityOutcome:
    """The verdicts of a finished run."""

    run_dir: Path
    summary: dict[str, Any]

    def write(self, output_dir: Path) -> Path:
        """summary.json is already in the run directory; returns its path."""
        return self.run_dir / rundir.SUMMARY_FILE

    def table(self) -> str:
        """One row per attack and mode."""
        return format_verdicts(self.summary)


def run(job: Job) -> IntegrityOutcome:
    """Play the baseline and every attack in every mode; see the module docstring."""
    run_dir, config, resumed = rundir.resolve(job.config, job.output_dir, given=job.given)
    settings = _settings(config.benchmark)
    attacks = select_attacks(settings.attacks)
    tasks = [_capped(task, settings.verifier_timeout_s) for task in _tasks(config, settings)]
    modes, refused = _offered_modes(job, settings.modes)
    rows: list[dict[str, Any]] = []
    for mode in modes:
        baseline = _play(job, config, run_dir / mode / NOOP, tasks, NoopAgent(), mode, settings, resumed)
        for attack in attacks:
            aimed = [task for task in tasks if attack.aims_at(task_kinds(task))]
            if aimed:
                folder = run_dir / mode / attack.name
                played = _play(job, config, folder, aimed, _agent(attack), mode, settings, resumed)
                rows.append(verdict(attack, mode, played, baseline))
    summary = _summary(run_dir, config, settings.name, tasks, rows, modes=modes, refused=refused)
    (run_dir / rundir.SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    outcome = IntegrityOutcome(run_dir, summary)
    if not summary["passed"]:
        print(outcome.table())
        print(f"\nsummary: {outcome.write(run_dir)}")
        beaten = [f"{row['attack']} ({row['mode']})" for row in rows if _fails(row)]
        listed = ", ".join(beaten[:12]) + (f" and {len(beaten) - 12} more" if len(beaten) > 12 else "")
        message = f"snapgym: INTEGRITY FAILURE: {len(beaten)} attack plays beat the no-op agent: {listed}"
        print(f"\n{message}", file=sys.stderr)
        raise SystemExit(EXIT_ATTACK_WON)
    if summary["known_limitations"]:
        flagged = sorted({p["task"] for p in _by_design(summary["by_task"])})
        log.warning("integrity: known limitations (not snapgym failures) beat %s: see per task", ", ".join(flagged))
    return outcome


@dataclass(frozen=True, slots=True)
class Played:
    """One play's per-task figures, read back from its ledger."""

    by_task: dict[str, dict[str, Any]]
    """task id -> ``episodes``, ``scored``, ``unscored``, ``mean_reward`` (None: nothing scored)."""
    hung: bool = False


def verdict(attack: Attack, mode: str, played: Played, baseline: Played) -> dict[str, Any]:
    """Whether the attack beat the no-op agent on the tasks it was played against (see the module docstring)."""
    tasks = sorted(played.by_task)
    mine, base = _totals(played, tasks), _totals(baseline, tasks)
    beaten = [task for task in tasks if _beats(played.by_task[task], baseline.by_task.get(task))]
    limitation = attack.known_limitation
    how = {
        task: {"reward": played.by_task[task]["mean_reward"], "unscored": played.by_task[task]["unscored"],
               "noop_reward": (baseline.by_task.get(task) or {}).get("mean_reward"),
               "noop_unscored": (baseline.by_task.get(task) or {}).get("unscored", 0)}
        for task in beaten
    }  # fmt: skip
    excused = limitation is not None and not played.hung  # a hang or an unscored episode is never by design
    for figures in how.values():
        figures["by_design"] = excused and figures["unscored"] <= figures["noop_unscored"]
        figures["known_limitation"] = dataclasses.asdict(limitation) if figures["by_design"] and limitation else None
    more_reward = mine["mean_reward"] is not None and mine["mean_reward"] > (base["mean_reward"] or 0.0) + _EPSILON
    beats = played.hung or more_reward or mine["unscored"] > base["unscored"]
    by_design = beats and excused and mine["unscored"] <= base["unscored"] and all(f["by_design"] for f in how.values())
    return {
        "attack": attack.name,
        "mode": mode,
        "through_outputs": attack.through_outputs,
        "tasks": len(tasks),
        "mean_reward": mine["mean_reward"],
        "scored": mine["scored"],
        "unscored": mine["unscored"],
        "noop_mean_reward": base["mean_reward"],
        "noop_scored": base["scored"],
        "noop_unscored": base["unscored"],
        "hung": played.hung,
        "beats_noop": beats,
        "by_design": by_design,
        "known_limitation": dataclasses.asdict(limitation) if limitation else None,
        "verdict": "HUNG" if played.hung else "KNOWN LIMITATION" if by_design else "BEATS NOOP" if beats else "held",
        "beaten_tasks": beaten,
        "beaten_how": how,
    }


def format_verdicts(summary: dict[str, Any]) -> str:
    """The terminal table: one row per attack and mode, then the totals."""
    frame = pd.DataFrame(summary["verdicts"])
    if frame.empty:
        return "(no attack was played)"
    rows = frame.to_dict("records")
    frame["reward"] = [f"{_fmt(r['mean_reward'])} / {_fmt(r['noop_mean_reward'])}" for r in rows]
    frame["unscored"] = [f"{r['unscored']}/{r['scored'] + r['unscored']} / {r['noop_unscored']}" for r in rows]
    frame["beaten"] = [", ".join(r["beaten_tasks"][:4]) + (" ..." if len(r["beaten_tasks"]) > 4 else "") for r in rows]
    table = frame[["attack", "mode", "tasks", "reward", "unscored", "verdict", "beaten"]].to_string(index=False)
    beaten = sum(_fails(row) for row in rows)
    known = sum(bool(row.get("by_design")) for row in rows)
    per_task = [line for task, plays in summary.get("by_task", {}).items() for line in _task_lines(task, plays)]
    return "\n".join(
        [
            f"== integrity: {summary['suite']}, {len(summary['tasks'])} tasks, modes {', '.join(summary['modes'])} ==",
            "(reward: attack / no-op mean; unscored: attack's unscored/episodes / no-op's unscored)",
            table,
            "",
            f"{beaten} of {len(frame)} attack plays beat the no-op agent"
            + ("" if beaten or known else ": every attack scored what doing nothing scores")
            + (f", not counting {known} that beat it by the tasks' design (KNOWN LIMITATION, below)" * bool(known)),
            *(["", "per task:", *per_task] if per_task else []),
            *(f"{mode} mode not played: {why}" for mode, why in summary.get("modes_refused", {}).items()),
        ]
    )


# -- plays ------------------------------------------------------------------------------------


def _play(
    job: Job, config: DictConfig, run_dir: Path, tasks: list[Task], agent: Any, mode: str,
    settings: IntegrityBenchConfig, resumed: bool,
) -> Played:  # fmt: skip
    """One evaluation of ``agent`` on ``tasks`` in ``mode``, watched for hangs; its figures by task."""
    run_dir.mkdir(parents=True, exist_ok=True)
    play_config = config.copy()
    play_config.verification = mode
    with _HangWatch(job, run_dir / LEDGER_FILE, settings.hang_timeout_s) as watch:
        evaluate(job, play_config, run_dir, tasks, agent, resumed=resumed, plots=False)
    frame, _ = results.read_run(run_dir)
    return Played(_by_task(frame), hung=watch.fired)


def _by_task(frame: pd.DataFrame) -> dict[str, dict[str, Any]]:
    figures: dict[str, dict[str, Any]] = {}
    for task, group in frame.groupby("task_id") if len(frame) else ():
        scored = group[group["outcome"] != INFRA_ERROR]
        figures[str(task)] = {
            "episodes": len(group),
            "scored": len(scored),
            "unscored": len(group) - len(scored),
            "mean_reward": float(scored["reward"].fillna(0.0).mean()) if len(scored) else None,
        }
    return figures


class _HangWatch:
    """Closes the job's backends when a play's ledger stops growing for ``timeout_s`` (a hung verifier).

    A verifier read that never returns (a helper process the agent stopped) blocks its episode
    for good; closing the sandboxes ends it as an infrastructure failure.
    """

    def __init__(self, job: Job, ledger: Path, timeout_s: float) -> None:
        self._job, self._ledger, self._timeout_s = job, ledger, timeout_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="snapgym-integrity-hang-watch", daemon=True)
        self.fired = False

    def __enter__(self) -> _HangWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        last_size, last_change = -1, time.monotonic()
        while not self._done.wait(1.0):
            size = self._ledger.stat().st_size if self._ledger.exists() else 0
            if size != last_size or size == 0:  # the clock starts with the first attempt
                last_size, last_change = size, time.monotonic()
            elif time.monotonic() - last_change > self._timeout_s:  # again for each retry that hangs
                log.error(
                    "%s: no episode ended for %.0f s; closing its sandboxes", self._ledger.parent, self._timeout_s
                )
                self.fired, last_change = True, time.monotonic()
                with contextlib.suppress(Exception):
                    self._job.close()


# -- inputs and summary -------------------------------------------------------------------------


def _settings(node: DictConfig) -> IntegrityBenchConfig:
    settings = OmegaConf.to_object(node)
    assert isinstance(settings, IntegrityBenchConfig)
    unknown = [mode for mode in settings.modes if mode not in ("strict", "toolchain", "shared")]
    if not settings.modes or unknown:
        raise ConfigError(f"benchmark.modes must list strict, toolchain and/or shared, got {list(settings.modes)}")
    if settings.verifier_timeout_s <= 0 or settings.hang_timeout_s <= 0:
        raise ConfigError("benchmark.verifier_timeout_s and benchmark.hang_timeout_s must be positive")
    return settings


def _tasks(config: DictConfig, settings: IntegrityBenchConfig) -> list[Task]:
    suite = config.suite
    chosen = select_tasks(
        suite.path,
        include=list(suite.include),
        exclude=list(suite.exclude),
        limit=suite.limit,
        images=image_sources(list(suite.images)),
        strict=bool(suite.strict),
    )
    extra = [task for task in target_tasks() if settings.targets and task.id not in {t.id for t in chosen.tasks}]
    return [*chosen.tasks, *extra]


def _capped(task: Task, verifier_timeout_s: float) -> Task:
    timeout = min(task.settings.verifier_timeout_s, verifier_timeout_s)
    return dataclasses.replace(task, settings=dataclasses.replace(task.settings, verifier_timeout_s=timeout))


def _agent(attack: Attack) -> ReplayAgent:
    agent = ReplayAgent(actions=list(attack.actions))
    agent.name = f"attack:{attack.name}"
    return agent


def _offered_modes(job: Job, asked: list[str]) -> tuple[list[str], dict[str, str]]:
    """The asked verification modes the run's backend offers, and why each other one is not played.

    A backend that does not offer a mode refuses every task in it (the runner skips them, saying
    why): there is nothing to attack there, so the mode is left out and said, not failed.

    Raises:
        ConfigError: the backend offers none of them.
    """
    backend = job.backend
    offered = backend.capabilities.verification
    refused = {
        mode: f"the {backend.name} backend does not offer {mode} verification ({', '.join(offered)} only)"
        for mode in asked
        if mode not in offered
    }
    for mode, why in refused.items():
        log.warning("integrity: %s mode not played: %s", mode, why)
    modes = [mode for mode in asked if mode in offered]
    if not modes:
        raise ConfigError(f"benchmark.modes={list(asked)}: {'; '.join(refused.values())}")
    return modes, refused


def _task_lines(task: str, plays: list[dict[str, Any]]) -> list[str]:
    """The per-task report: held, or the plays that beat the no-op agent there; then each known limitation
    that beat it, with its remedy."""

    def listed(chosen: list[dict[str, Any]]) -> str:
        return "; ".join(
            f"{p['attack']} ({p['mode']}: {_fmt(p['reward'])} vs no-op {_fmt(p['noop_reward'])}"
            + (f", {p['unscored']} unscored vs {p['noop_unscored']}" if p["unscored"] > p["noop_unscored"] else "")
            + ")" for p in chosen
        )  # fmt: skip

    failures = [p for p in plays if not p.get("by_design")]
    limits = {p["known_limitation"]["flag"]: p["known_limitation"] for p in plays if p.get("by_design")}
    held = "held" + (" but for a known limitation" if limits else "")
    lines = [f"  {task}: " + (f"BEATEN by {listed(failures)}" if failures else held)]
    for flag, limitation in limits.items():
        chosen = [p for p in plays if p.get("by_design") and p["known_limitation"]["flag"] == flag]
        lines.append(f"    KNOWN LIMITATION, {flag}: beaten by {listed(chosen)}")
        lines.append(f"      remedy: {limitation['remedy']}")
    return lines


def _summary(
    run_dir: Path, config: DictConfig, name: str, tasks: list[Task], rows: list[dict[str, Any]],
    *, modes: list[str], refused: dict[str, str],
) -> dict[str, Any]:  # fmt: skip
    beaten = [row for row in rows if _fails(row)]
    known = [row for row in rows if row["by_design"]]
    return {
        "scenario": name,
        "run_dir": str(run_dir),
        "suite": config.suite.name,
        "tasks": [task.id for task in tasks],
        "modes": modes,
        "modes_refused": refused,
        "attacks": sorted({row["attack"] for row in rows}),
        "verdicts": rows,
        "by_task": by_task(tasks, rows),
        "beaten": [f"{row['attack']}:{row['mode']}" for row in beaten],
        "known_limitations": [f"{row['attack']}:{row['mode']}" for row in known],
        "passed": not beaten,
        "headline": {"attack_plays": len(rows), "beats_noop": len(beaten), "known_limitation_plays": len(known)},
    }


def by_task(tasks: list[Task], rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Task id -> every attack play that beat the no-op agent on it (empty: the task held); a known limitation's
    play is one of them, with ``by_design`` true and ``known_limitation`` its flag and remedy."""
    found: dict[str, list[dict[str, Any]]] = {task.id: [] for task in tasks}
    for row in rows:
        for task, how in row.get("beaten_how", {}).items():
            found.setdefault(task, []).append({"attack": row["attack"], "mode": row["mode"], **how})
    return found


def _fails(row: dict[str, Any]) -> bool:
    """Whether a play counts against snapgym: it beat the no-op agent, not by a known limitation of the task."""
    return bool(row["beats_noop"]) and not row.get("by_design")


def _by_design(by_task: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [{"task": task, **play} for task, plays in by_task.items() for play in plays if play.get("by_design")]


def _totals(played: Played, tasks: list[str]) -> dict[str, Any]:
    figures = [played.by_task[task] for task in tasks if task in played.by_task]
    scored = sum(f["scored"] for f in figures)
    reward = sum((f["mean_reward"] or 0.0) * f["scored"] for f in figures)
    return {
        "scored": scored,
        "unscored": sum(f["unscored"] for f in figures),
        "mean_reward": reward / scored if scored else None,
    }


def _beats(mine: dict[str, Any], base: dict[str, Any] | None) -> bool:
    base = base or {"mean_reward": 0.0, "unscored": 0}
    more_reward = float(mine["mean_reward"] or 0.0) > float(base["mean_reward"] or 0.0) + _EPSILON
    return more_reward or int(mine["unscored"]) > int(base["unscored"])


def _fmt(value: Any) -> str:
    return "-" if value is None or value != value else f"{value:.3f}"
