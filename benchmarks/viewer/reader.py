"""What the viewer knows about a run directory: its state, its headline, its episodes.

The ledger is read with ``benchmarks.episodes.recording.ledger``'s own reader (a torn last line,
one being written, is skipped) and folded with its ``LedgerState``, so each
episode shows once, by its standing result. It is read again only when its
size or modification time changed, so a page polling a finished run costs a
``stat``.

A run is ``in_progress`` while it has no summary.json, or while a resume
appends to its ledger after an older summary (the ledger is newer and holds
records the summary does not count); otherwise ``finished`` when
``benchmarks.episodes.recording.rundir.is_finished`` says so, else ``incomplete``: it stopped
early or left episodes unscored, and a resume plays them. Only a finished run
stops the page's polling.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from benchmarks.episodes.attempt import UNSCORED
from benchmarks.episodes.recording import episodefiles, rundir
from benchmarks.episodes.recording.ledger import LEDGER_FILE, LedgerCorruptError, LedgerState, read_records
from benchmarks.reports import results
from benchmarks.viewer.access import RunFiles
from benchmarks.viewer.episode import describe, episode_folder, token_count
from pool.errors import SnapgymError

FINISHED, INCOMPLETE, IN_PROGRESS = "finished", "incomplete", "in_progress"
RUN_FILES = (rundir.RUN_CONFIG, rundir.SUMMARY_FILE, LEDGER_FILE, results.EPISODES_CSV, results.EPISODES_PARQUET,
             "run.log")  # fmt: skip
HEADLINE = (
    ("benchmark", "benchmark.name"), ("suite", "suite.name"), ("tasks", "suite.include"), ("agent", "agent.name"),
    ("model", "agent.model"), ("backend", "backend.name"), ("pool", "pool.kind"), ("pool size", "pool.size"),
    ("env", "env"), ("episodes per task", "episodes_per_task"), ("verification", "verification"),
    ("network", "network"), ("max steps", "max_steps"),
)  # fmt: skip
"""The config keys the index page heads with (label, key in run.yaml)."""
MAX_SUBRUNS = 20


class NotARunDirError(SnapgymError, ValueError):
    """The path given is not a run directory (no ledger.jsonl, no run.yaml)."""


def check_run_dir(path: Path) -> Path:
    """``path`` when it is a run directory.

    Raises:
        NotARunDirError: naming what is missing, and the runs below it when it holds some.
    """
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a folder"
        raise NotARunDirError(
            f"{path} {what}; give the run directory `python -m benchmarks.run` printed (results: ...)"
        )
    if (path / LEDGER_FILE).is_file():
        return path
    inner = sorted({ledger.parent for depth in (1, 2, 3) for ledger in path.glob("*/" * depth + LEDGER_FILE)})
    if inner:
        named = ", ".join(str(run) for run in inner[:MAX_SUBRUNS]) + (", ..." if len(inner) > MAX_SUBRUNS else "")
        raise NotARunDirError(f"{path} is not a run directory but holds runs; view one of them: {named}")
    if (path / rundir.RUN_CONFIG).is_file():
        return path  # a run that has not written its ledger yet
    why = f"it has neither {LEDGER_FILE} nor {rundir.RUN_CONFIG}"
    if (path / rundir.SUMMARY_FILE).is_file():
        why = f"it has a {rundir.SUMMARY_FILE} but no {LEDGER_FILE}: that benchmark records no episodes"
    raise NotARunDirError(
        f"{path} is not a run directory ({why}); give the folder of an eval run, the one "
        "`python -m benchmarks.run` printed (results: outputs/<date>/<time>-eval)"
    )


@dataclass(frozen=True, slots=True)
class _Ledger:
    stamp: tuple[int, int]
    state: LedgerState
    error: str | None


class RunReader:
    """Reads one run directory on demand; safe to share between the server's threads.

    Args:
        run_dir: a run directory (see :func:`check_run_dir`).
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = check_run_dir(run_dir)
        self.files = RunFiles(run_dir)
        self._lock = threading.Lock()
        self._ledger = _Ledger((-1, -1), LedgerState(), None)
        self._tokens: dict[tuple[str, int], int | None] = {}

    def run(self) -> dict[str, Any]:
        """The index page's head: state, config headline, counts, summary, plots, run files."""
        ledger = self._read_ledger()
        standing = list(ledger.state.results.values())
        summary = self.files.read_json(rundir.SUMMARY_FILE)
        state, detail = self._state(ledger.state, summary if isinstance(summary, dict) else None)
        return {
            "run_dir": str(self.run_dir),
            "state": state,
            "detail": detail,
            "live": state != FINISHED,
            "version": f"{ledger.stamp[0]}-{ledger.stamp[1]}",
            "ledger_error": ledger.error,
            "headline": self._headline(),
            "counts": _counts(standing),
            "in_flight": len(ledger.state.unfinished),
            "mean_reward": _mean_reward(standing),
            "summary": summary if isinstance(summary, dict) else None,
            "plots": [self._stamped(path.name) for path in sorted(self.run_dir.glob("*.png")) if path.is_file()],
            "files": [self._stamped(name) for name in RUN_FILES if self.files.exists(name)],
        }

    def episodes(self) -> list[dict[str, Any]]:
        """One row per episode with a standing result, by task and sample."""
        standing = self._read_ledger().state.results.values()
        return [self._row(record) for record in sorted(standing, key=_order)]

    def episode(self, episode_id: str) -> dict[str, Any] | None:
        """An episode's page (see ``benchmarks.viewer.episode``); None when it has no result yet."""
        record = self._read_ledger().state.results.get(episode_id)
        return None if record is None else describe(self.files, record)

    def _read_ledger(self) -> _Ledger:
        path = self.run_dir / LEDGER_FILE
        try:
            info = path.stat()
            stamp = (info.st_size, info.st_mtime_ns)
        except FileNotFoundError:
            stamp = (0, 0)
        with self._lock:
            if stamp != self._ledger.stamp:
                self._ledger = _fold(path, stamp)
            return self._ledger

    def _state(self, ledger: LedgerState, summary: dict[str, Any] | None) -> tuple[str, str]:
        if summary is None:
            return IN_PROGRESS, "no summary.json yet: the run is in progress (or was stopped before writing one)"
        if _resumed(ledger, summary) and self._mtime(LEDGER_FILE) > self._mtime(rundir.SUMMARY_FILE):
            return (
                IN_PROGRESS,
                "the ledger has records summary.json does not count: a resume of this run is in progress",
            )
        if rundir.is_finished(self.run_dir):
            return FINISHED, "every scheduled episode has a final result"
        why = summary.get("stopped") or "some episodes were left unscored by infrastructure failures"
        return INCOMPLETE, f"{why}; play the rest with python -m benchmarks.run resume={self.run_dir}"

    def _headline(self) -> list[list[str]]:
        try:
            config = OmegaConf.load(self.files.resolve(rundir.RUN_CONFIG))
            if not isinstance(config, DictConfig):
                return []
            found = [(label, OmegaConf.select(config, key, default=None)) for label, key in HEADLINE]
        except (OSError, SnapgymError, ValueError, OmegaConfBaseException):
            return []
        return [[label, _plain(value)] for label, value in found if value not in (None, "", [])]

    def _row(self, record: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": record.get("episode_id"),
            "task": record.get("task_id"),
            "sample": record.get("sample"),
            "attempt": record.get("attempt"),
            "outcome": record.get("outcome"),
            "reward": record.get("reward"),
            "passed": record.get("passed"),
            "episode_s": record.get("episode_s"),
            "steps": record.get("steps"),
            "tokens": self._tokens_of(record),
            "end_reason": record.get("end_reason"),
            "error": str(record.get("error") or "").split("\n", 1)[0][:300] or None,
        }

    def _tokens_of(self, record: dict[str, Any]) -> int | None:
        """Tokens the model used in an episode: the result's counts, else its trajectory's (read once)."""
        counted = token_count(record)
        if counted is not None:
            return counted
        files = record.get("files") or {}
        relative = files.get("trajectory") or f"{episode_folder(record)}/{episodefiles.TRAJECTORY_FILE}"
        key = (str(relative), self._mtime(str(relative)))
        if key not in self._tokens:
            trajectory = self.files.read_json(str(relative))
            metrics = trajectory.get("final_metrics") if isinstance(trajectory, dict) else None
            self._tokens[key] = token_count(metrics) if isinstance(metrics, dict) else None
        return self._tokens[key]

    def _mtime(self, relative: str) -> int:
        try:
            return self.files.resolve(relative).stat().st_mtime_ns
        except (OSError, SnapgymError):
            return 0

    def _stamped(self, name: str) -> dict[str, Any]:
        return {"path": name, "version": self._mtime(name)}


def _fold(path: Path, stamp: tuple[int, int]) -> _Ledger:
    state = LedgerState()
    try:
        for record in read_records(path) if path.is_file() else ():
            state.observe(record)
    except LedgerCorruptError as exc:
        return _Ledger(stamp, state, str(exc))
    except (KeyError, TypeError, ValueError) as exc:
        return _Ledger(stamp, state, f"{path}: a record the viewer cannot read ({type(exc).__name__}: {exc})")
    return _Ledger(stamp, state, None)


def _resumed(ledger: LedgerState, summary: dict[str, Any]) -> bool:
    """Whether the ledger moved on since the summary was written (a resume appends attempts, results and
    supersessions). Its content decides, not only its time: a copied run directory has new times."""
    counts = summary.get("counts")
    if not isinstance(counts, dict):
        return True
    return bool(
        ledger.unfinished
        or len(ledger.results) != counts.get("finished")
        or ledger.superseded != counts.get("superseded", 0)
    )


def _order(record: dict[str, Any]) -> tuple[str, int]:
    return str(record.get("task_id")), int(record.get("sample") or 0)


def _counts(standing: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in standing:
        outcome = str(record.get("outcome"))
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def _mean_reward(standing: list[dict[str, Any]]) -> float | None:
    """As the summary counts it: unscored outcomes left out, a missing reward (agent error, timeout) as 0."""
    counted = [float(r.get("reward") or 0.0) for r in standing if r.get("outcome") not in UNSCORED]
    return sum(counted) / len(counted) if counted else None


def _plain(value: Any) -> str:
    if isinstance(value, DictConfig) or OmegaConf.is_list(value):
        return str(OmegaConf.to_container(value, resolve=True))
    return str(value)
