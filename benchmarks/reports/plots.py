"""PNG plots of a run: reward by task, reset latency distribution, throughput over time (matplotlib).

Figures are plain ``matplotlib.figure.Figure`` objects, not pyplot's, so this never changes the caller's
matplotlib backend (a notebook keeps its inline plots) and leaves no figure open.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from benchmarks.episodes.attempt import UNSCORED
from benchmarks.reports.results import session_clock

REWARD_PLOT = "reward_by_task.png"
RESET_PLOT = "reset_latency.png"
THROUGHPUT_PLOT = "throughput.png"


def write_plots(run_dir: Path, frame: pd.DataFrame) -> list[Path]:
    """Write the three plots of an episode table; returns their paths (none for an empty table)."""
    if frame.empty:
        return []
    return [_reward_by_task(run_dir, frame), _reset_latency(run_dir, frame), _throughput(run_dir, frame)]


def _reward_by_task(run_dir: Path, frame: pd.DataFrame) -> Path:
    counted = frame[~frame["outcome"].isin(UNSCORED)]
    means = counted.assign(reward=counted["reward"].fillna(0.0)).groupby("task_id")["reward"].mean()
    unscored = sorted(set(frame["task_id"]) - set(means.index))
    means = pd.concat([means, pd.Series(0.0, index=unscored)]).sort_index()
    figure = Figure(figsize=(8, max(2.5, 0.3 * len(means) + 1)))
    axes = figure.subplots()
    colors = ["#c0c0c0" if task in unscored else "#4c72b0" for task in means.index]
    axes.barh(means.index, means.values, color=colors)
    for row, task in enumerate(means.index):
        if task in unscored:
            axes.text(0.01, row, "no scored episode (infrastructure failures)", va="center", fontsize=8)
    axes.set_xlim(0, 1.05)
    axes.set_xlabel("mean reward (infrastructure failures excluded)")
    axes.invert_yaxis()
    axes.set_title("Reward by task")
    return _save(figure, run_dir / REWARD_PLOT)


def _reset_latency(run_dir: Path, frame: pd.DataFrame) -> Path:
    """env.reset() wall time by how the sandbox was placed: a restore is what the headline figures are;
    a create (each environment's first episode) is a new sandbox."""
    figure = Figure(figsize=(7, 3.5))
    axes = figure.subplots()
    kinds = frame["reset_kind"].fillna("restored") if "reset_kind" in frame else pd.Series("restored", frame.index)
    values = frame["reset_latency_ms"]
    shown = []
    for kind, color in (("restored", "#55a868"), ("pristine", "#8172b2"), ("created", "#c44e52")):
        chosen = values[kinds == kind].dropna()
        if len(chosen):
            axes.hist(chosen, bins=min(50, max(5, len(chosen) // 4)), color=color, alpha=0.8,
                      label=f"{kind}: {len(chosen)}, p50 {chosen.median():.2f} ms")  # fmt: skip
            shown.append(kind)
    axes.set_xlabel("env.reset() time (ms)")
    axes.set_ylabel("episodes")
    restored = values[kinds == "restored"].dropna()
    title = f"Reset latency (restore p50 {restored.median():.2f} ms)" if len(restored) else "Reset latency"
    axes.set_title(title)
    if shown:
        axes.legend(title="sandbox")
    return _save(figure, run_dir / RESET_PLOT)


def _throughput(run_dir: Path, frame: pd.DataFrame) -> Path:
    figure = Figure(figsize=(7, 3.5))
    axes = figure.subplots()
    for run_id, group in frame.groupby("run_id"):
        start, end = session_clock(group)
        finished = end.sort_values()
        axes.plot(finished - start.min(), range(1, len(finished) + 1), label=str(run_id))
    axes.set_xlabel("seconds since the session started")
    axes.set_ylabel("episodes finished")
    axes.set_title("Throughput")
    if frame["run_id"].nunique() > 1:
        axes.legend(title="session")
    return _save(figure, run_dir / THROUGHPUT_PLOT)


def _save(figure: Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path
