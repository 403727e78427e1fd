"""A Hydra callback that combines a multirun's results into one table and plot.

After ``python -m benchmarks.run -m benchmark=throughput pool.size=1,2,4,8``
the sweep directory gets ``combined.csv`` (one row per job: its overrides and
its summary's ``headline`` figures), ``combined.png`` (each headline figure
against the one swept value that is numeric, when there is one) and the
same table on stdout.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

COMBINED_CSV = "combined.csv"
COMBINED_PLOT = "combined.png"

log = logging.getLogger(__name__)


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
        plotted = plot_combined(frame, sweep_dir / COMBINED_PLOT)
        print(f"\n== multirun: {len(frame)} jobs ==\n{frame.to_string(index=False)}")
        print(f"\ncombined: {sweep_dir / COMBINED_CSV}" + (f", {plotted}" if plotted else ""))


def combine(sweep_dir: Path) -> pd.DataFrame:
    """One row per job directory: its overrides, then its headline figures."""
    rows = []
    for summary_path in sorted(sweep_dir.glob("*/summary.json"), key=lambda p: _job_number(p.parent)):
        job_dir = summary_path.parent
        summary = json.loads(summary_path.read_text())
        overrides = _overrides(job_dir)
        rows.append({"job": job_dir.name, **overrides, **summary.get("headline", {})})
    return pd.DataFrame(rows)


def plot_combined(frame: pd.DataFrame, path: Path) -> Path | None:
    """Each headline figure against the numeric swept key; None when no key is numeric and swept."""
    from matplotlib.figure import Figure

    swept = [c for c in frame.columns if "=" not in c and c != "job" and _is_swept_number(frame, c)]
    if not swept:
        return None
    x = swept[0]
    metrics = [
        c
        for c in frame.columns
        if c not in {"job", *_override_columns(frame)}
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
