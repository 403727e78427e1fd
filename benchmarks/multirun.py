"""A multirun's jobs: each one's failure kept to itself, and the results combined into one table and plot.

After ``python -m benchmarks.run -m benchmark=throughput pool.size=1,2,4,8``
the sweep directory gets ``combined.csv`` (one row per job: its overrides and
its summary's ``headline`` figures), ``combined.png`` (each headline figure
against the one swept value that is numeric, when there is one) and the
same table on stdout. A job that fails (bad input, a stopped or incomplete
run, an error of snapgym's own) does not end the sweep: :func:`job_failures`
writes why into its directory (``job_failed.json``), the other jobs run, the
combined table names it (``failed``), and the sweep exits with the failed
jobs' highest status (:func:`sweep_status`). Ctrl-C still stops the sweep.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

COMBINED_CSV = "combined.csv"
COMBINED_PLOT = "combined.png"
JOB_FAILED = "job_failed.json"
"""In a failed job's directory: ``{"exit": status, "error": the one line it printed}``."""
INTERRUPTED = 130
"""The status of Ctrl-C, which stops the whole sweep rather than one job."""

_failed: list[tuple[str, int, str]] = []
"""The jobs of this process's sweep that failed: (job directory, exit status, error line)."""
_last_error = ""

log = logging.getLogger(__name__)


def note_error(line: str) -> None:
    """Remember the one line a job printed as its error (a failed job's ``job_failed.json`` holds it)."""
    global _last_error
    _last_error = line


@contextlib.contextmanager
def job_failures(job_dir: Path) -> Iterator[None]:
    """Run one job of a sweep so that its failure is recorded in ``job_dir`` instead of ending the sweep:
    its exit status (a ``sys.exit`` of the runner's) or an error of snapgym's own, with a traceback
    in ``job_failed.txt``. Ctrl-C (status 130) and KeyboardInterrupt still stop the sweep."""
    note_error("")
    try:
        yield
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
        if code in (0, INTERRUPTED):
            raise
        _record(job_dir, code, _last_error or f"exit status {code}")
    except Exception as exc:  # snapgym's own failure: named, with its traceback, and the sweep goes on
        (job_dir / "job_failed.txt").write_text(traceback.format_exc())
        line = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        print(f"snapgym: {line} (traceback: {job_dir / 'job_failed.txt'})", file=sys.stderr)
        _record(job_dir, 1, line)


def _record(job_dir: Path, code: int, error: str) -> None:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / JOB_FAILED).write_text(json.dumps({"exit": code, "error": error}) + "\n")
    _failed.append((job_dir.name, code, error))
    log.warning("job %s failed (exit %d): %s; the sweep goes on", job_dir.name, code, error)


def sweep_status() -> tuple[int, str]:
    """After a sweep: the highest exit status of its failed jobs (0: none failed) and a line naming them."""
    if not _failed:
        return 0, ""
    named = "; ".join(f"job {job} (exit {code}): {error}" for job, code, error in _failed)
    return max(code for _, code, _ in _failed), f"{len(_failed)} job(s) of the sweep failed: {named}"


class CombineResults(Callback):
    """Writes combined.csv and combined.png into the sweep directory when a multirun ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Gather every job's summary.json under the sweep directory."""
        sweep_dir = Path(config.hydra.sweep.dir)
        frame = combine(sweep_dir)
        if frame.empty:
            log.warning("no job of the multirun in %s wrote a summary.json", sweep_dir)
            return
        frame.to_csv(sweep_dir / COMBINED_CSV, index=False)
        finished = frame[frame["failed"].isna()] if "failed" in frame.columns else frame
        plotted = plot_combined(finished.dropna(axis=1, how="all"), sweep_dir / COMBINED_PLOT)
        print(f"\n== multirun: {len(frame)} jobs ==\n{frame.to_string(index=False)}")
        print(f"\ncombined: {sweep_dir / COMBINED_CSV}" + (f", {plotted}" if plotted else ""))


def combine(sweep_dir: Path) -> pd.DataFrame:
    """One row per job directory: its overrides, then its headline figures; a failed job's row has
    ``failed`` (its error line) and the figures of whatever summary it wrote."""
    rows = []
    jobs = {path.parent for name in ("summary.json", JOB_FAILED) for path in sweep_dir.glob(f"*/{name}")}
    for job_dir in sorted(jobs, key=_job_number):
        summary_path, failed_path = job_dir / "summary.json", job_dir / JOB_FAILED
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        row: dict[str, Any] = {"job": job_dir.name, **_overrides(job_dir), **summary.get("headline", {})}
        if failed_path.exists():
            row["failed"] = json.loads(failed_path.read_text()).get("error", "")
        rows.append(row)
    return pd.DataFrame(rows)


def plot_combined(frame: pd.DataFrame, path: Path) -> Path | None:
    """Each headline figure against the numeric swept key; None when no key is numeric and swept."""
    from matplotlib.figure import Figure

    swept = [c for c in frame.columns if "=" not in c and c not in ("job", "failed") and _is_swept_number(frame, c)]
    if not swept:
        return None
    x = swept[0]
    metrics = [
        c
        for c in frame.columns
        if c not in {"job", "failed", *_override_columns(frame)}
        and pd.api.types.is_numeric_dtype(frame[c])
        and frame[c].notna().any()
    ]
    varying = [c for c in metrics if frame[c].nunique() > 1]
    metrics = varying or metrics  # constant figures (all rewards 1.0, say) add panels without information
    if not metrics:
        return None
    figure = Figure(figsize=(6, 2.6 * len(metrics)))
    axes = figure.subplots(len(metrics), 1, squeeze=False)
    ordered = frame.sort_values(x)
    for axis, metric in zip(axes[:, 0], metrics, strict=True):
        axis.plot(ordered[x], ordered[metric], marker="o")
        axis.set_xlabel(x)
        axis.set_ylabel(metric)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def _overrides(job_dir: Path) -> dict[str, Any]:
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.exists():
        return {}
    values: dict[str, Any] = {}
    for item in OmegaConf.to_container(OmegaConf.load(path)) or []:
        key, _, value = str(item).partition("=")
        values[key.lstrip("+~")] = _number(value)
    return values


def _override_columns(frame: pd.DataFrame) -> set[str]:
    return {c for c in frame.columns if "." in c or c in {"benchmark", "pool", "agent", "suite", "backend"}}


def _is_swept_number(frame: pd.DataFrame, column: str) -> bool:
    return (
        column in _override_columns(frame)
        and pd.api.types.is_numeric_dtype(frame[column])
        and frame[column].nunique() > 1
    )


def _number(value: str) -> Any:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def _job_number(path: Path) -> tuple[int, str]:
    return (int(path.name), "") if path.name.isdigit() else (1 << 30, path.name)
