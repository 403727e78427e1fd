"""A run's results: the episode table (from the ledger), summary.json, and the terminal table.

``summary.json`` keys (eval and throughput):

- ``scenario``, ``run_dir``, ``suite``, ``agent``, ``env_id``, ``backend``.
- ``counts``: ``scheduled``, ``finished``, one count per outcome (``scored``,
  ``agent_error``, ``timeout``, ``infra_error``, ``network_denied``,
  ``network_unreachable``), ``retried_attempts`` (attempts
  that failed on infrastructure and were run again), ``interrupted_attempts``,
  ``outage_attempts`` (attempts that failed during an outage, not counted
  against max_attempts), ``superseded`` (infra_error results a resume played
  again); with ``checkpoint_every`` set, ``resumed_at_checkpoint`` (episodes that went on from
  a checkpoint after an interruption) and ``steps_replayed`` (steps played a second time because
  an interrupted episode could not go on from a checkpoint). Each episode counts once, by its
  standing result (see ``benchmarks.episodes.recording.ledger``).
- ``mean_reward``: over finished episodes except unscored ones (``infra_error``,
  ``network_denied``, ``network_unreachable``: left out, never 0; agent errors
  and timeouts count as 0).
- ``pass_rate``: the share of those episodes whose reward reached the threshold.
- ``pass_at_k``: {k: mean over tasks of the unbiased pass@k estimate}
  (Chen et al. 2021), for each k <= the episodes a task has.
- ``by_task``: per task, the same figures plus ``start_states_identical``.
- ``start_states_identical``: every episode started from its task snapshot's digest.
- ``latency_ms``: percentiles (p50/p90/p99/mean/n) of ``reset`` (every env.reset()), ``restore`` (the resets
  that restored a sandbox, not the ones that created one) and ``episode``.
- ``throughput``: ``episodes``, ``wall_s``, ``episodes_per_s`` (finished episodes
  per second of wall time, summed over the run's sessions when it was resumed;
  each session's span is measured on its monotonic clock, so a wall-clock step
  such as an NTP correction does not bend it).
- ``network``: connection attempts over the run (``attempts``, ``allowed``,
  ``denied``, ``unreachable``, ``bytes_up``, ``bytes_down``) and
  ``tasks_blocked``: per task whose verifier the network failed, the outcome,
  the hosts and the setting that would let it run; ``zeros_suspect``: per task,
  the scored 0.0 episodes whose verifier had connections fail (``episodes``,
  ``connections``), which may be the environment's 0 and not the agent's.
- ``sandbox_seconds``: ``total`` seconds episodes held a sandbox (reset to
  verdict; each result's ``sandbox_s``) and ``by_provider`` for the cloud
  backends, which bill them; each result also names its ``sandbox_id`` and
  ``provider``.
- ``outages`` (when there were any): this session's outages (reason, duration, probes).
- ``stopped`` (when the run stopped early): why, in one line; ``state``: ``interrupted`` when Ctrl-C stopped it.
- ``headline``: the few numbers a multirun compares.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.episodes.attempt import INFRA_ERROR, NETWORK_DENIED, NETWORK_UNREACHABLE, OUTCOMES, UNSCORED
from benchmarks.episodes.recording.ledger import ATTEMPT_FAILED, LEDGER_FILE, SUPERSEDED, LedgerState, read_records
from benchmarks.episodes.recording.rundir import SUMMARY_FILE
from benchmarks.reports.stats import summarize

EPISODES_PARQUET = "episodes.parquet"
EPISODES_CSV = "episodes.csv"


NESTED_COLUMNS = ("network", "network_failure", "network_suspect", "files")
"""Columns whose values are objects: the table holds them as JSON text (Parquet has no empty structs)."""


def episodes_frame(records: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per finished episode, sorted by task and sample (:data:`NESTED_COLUMNS` as JSON text)."""
    frame = pd.DataFrame([
        {k: json.dumps(v, default=str) if k in NESTED_COLUMNS and v is not None else v
         for k, v in r.items() if k != "kind"}
        for r in records
    ])  # fmt: skip
    if frame.empty:
        return frame
    return frame.sort_values(["task_id", "sample"], kind="stable").reset_index(drop=True)


def read_run(run_dir: Path) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """The episode table (each episode once, by its standing result) and the ``attempt_failed`` and
    ``superseded`` records of a run directory's ledger, read once."""
    path = run_dir / LEDGER_FILE
    state = LedgerState()
    history = []
    for record in read_records(path) if path.exists() else ():
        state.observe(record)
        if record["kind"] in (ATTEMPT_FAILED, SUPERSEDED):
            history.append(record)
    return episodes_frame(list(state.results.values())), history


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of a task with ``n`` episodes, ``c`` of them passed."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize_run(
    run_dir: Path,
    frame: pd.DataFrame,
    failed: Sequence[dict[str, Any]],
    *,
    scheduled: int,
    ks: Sequence[int],
    meta: dict[str, Any],
) -> dict[str, Any]:
    """The summary.json of a run (see the module docstring for its keys).

    Args:
        run_dir: the run directory (recorded in the summary).
        frame: the episode table (``episodes_frame`` of the result records).
        failed: the ledger's ``attempt_failed`` (and ``superseded``) records.
        scheduled: episodes the plan holds.
        ks: the k values of pass@k.
        meta: context copied into the summary (scenario, suite, agent, ...).
    """
    counts = {"scheduled": scheduled, "finished": len(frame)}
    counts.update({o: int((frame["outcome"] == o).sum()) if len(frame) else 0 for o in OUTCOMES})
    attempts = [r for r in failed if r["kind"] == ATTEMPT_FAILED]
    counts["retried_attempts"] = sum(not r.get("interrupted") and not r.get("outage") for r in attempts)
    counts["interrupted_attempts"] = sum(bool(r.get("interrupted")) for r in attempts)
    counts["outage_attempts"] = sum(bool(r.get("outage")) for r in attempts)
    counts["superseded"] = sum(r["kind"] == SUPERSEDED for r in failed)
    counts.update(_durability_counts(frame))
    by_task = {str(task): _task_figures(group, ks) for task, group in frame.groupby("task_id")} if len(frame) else {}
    summary: dict[str, Any] = {
        "scenario": meta.get("scenario", "eval"),
        "run_dir": str(run_dir),
        **{k: v for k, v in meta.items() if k != "scenario"},
        "counts": counts,
        **_reward_figures(frame, ks, by_task),
        "by_task": by_task,
        "start_states_identical": all(t["start_states_identical"] for t in by_task.values()),
        "latency_ms": {
            "reset": _percentiles(frame.get("reset_latency_ms")),
            "restore": _percentiles(_restores(frame)),
            "episode": _percentiles(None if frame.empty else frame["episode_s"] * 1000),
        },
        "throughput": _throughput(frame),
        "network": _network_figures(frame),
        "sandbox_seconds": _sandbox_seconds(frame),
        "infra_causes": _infra_causes(frame),
    }
    summary["headline"] = {
        "mean_reward": summary["mean_reward"],
        "pass_rate": summary["pass_rate"],
        "episodes_per_s": summary["throughput"]["episodes_per_s"],
        "reset_p50_ms": (summary["latency_ms"]["reset"] or {}).get("p50_ms"),
        "episode_p50_ms": (summary["latency_ms"]["episode"] or {}).get("p50_ms"),
        "infra_error": counts[INFRA_ERROR],
    }
    return summary


def _restores(frame: pd.DataFrame) -> pd.Series | None:
    """Reset latencies of the episodes whose reset was a restore (not a new sandbox)."""
    if frame.empty or "reset_kind" not in frame:
        return None
    return frame.loc[frame["reset_kind"] == "restored", "reset_latency_ms"]


def _infra_causes(frame: pd.DataFrame, most: int = 5) -> dict[str, int]:
    """The commonest errors of episodes that ended as infrastructure errors, with their counts."""
    if frame.empty or "error" not in frame:
        return {}
    errors = frame.loc[frame["outcome"] == INFRA_ERROR, "error"].fillna("(no message)").astype(str)
    return {str(error): int(count) for error, count in errors.value_counts().head(most).items()}


def write_tables(run_dir: Path, frame: pd.DataFrame, summary: dict[str, Any]) -> None:
    """Write episodes.parquet, episodes.csv and summary.json into ``run_dir``, each whole or not at all.

    Raises:
        OSError: a file could not be written (a full disk); no half-written file is left.
    """
    _write_whole(run_dir / EPISODES_PARQUET, lambda path: frame.to_parquet(path, index=False))
    _write_whole(run_dir / EPISODES_CSV, lambda path: frame.to_csv(path, index=False))
    text = json.dumps(summary, indent=2, default=str) + "\n"
    _write_whole(run_dir / SUMMARY_FILE, lambda path: path.write_text(text))


def _write_whole(path: Path, write: Any) -> None:
    """``write(temporary path)``, then rename it over ``path`` (a failed write leaves the old file, or none)."""
    staged = path.with_name(f".{path.name}.tmp")
    try:
        write(staged)
        os.replace(staged, path)
    finally:
        staged.unlink(missing_ok=True)


def format_summary(summary: dict[str, Any]) -> str:
    """The terminal table: one row per task, then the totals."""
    rows = {
        task: {
            "episodes": figures["episodes"],
            "mean_reward": _fmt(figures["mean_reward"]),
            "pass@1": _fmt(figures["pass_at_k"].get("1")),
            "infra_err": figures["infra_error"],
            "agent_err": figures["agent_error"] + figures["timeout"],
            "episode_s": _fmt(figures["mean_episode_s"], 2),
        }
        for task, figures in summary["by_task"].items()
    }
    table = pd.DataFrame.from_dict(rows, orient="index").to_string() if rows else "(no episodes)"
    counts = summary["counts"]
    throughput = summary["throughput"]
    lines = [
        f"== {summary['scenario']}: {summary.get('suite', '')} with agent {summary.get('agent', '')} ==",
        table,
        "",
        f"episodes {counts['finished']}/{counts['scheduled']}: scored {counts['scored']}, "
        f"agent errors {counts['agent_error']}, timeouts {counts['timeout']}, infra errors {counts['infra_error']}, "
        f"network-blocked {counts.get(NETWORK_DENIED, 0) + counts.get(NETWORK_UNREACHABLE, 0)}" + _replayed(counts),
        f"mean reward {_fmt(summary['mean_reward'])}, pass rate {_fmt(summary['pass_rate'])}, "
        + ", ".join(f"pass@{k} {_fmt(v)}" for k, v in summary["pass_at_k"].items()),
        *(f"skipped {task}: {why}" for task, why in summary.get("skipped_tasks", {}).items()),
        *(
            f"unscored {task} ({info['outcome']}, {info['episodes']} episode(s)): {info['hint']}"
            for task, info in (summary.get("network") or {}).get("tasks_blocked", {}).items()
        ),
        *(
            f"suspect {task}: {info['episodes']} episode(s) scored 0.0 while the verifier's connections failed "
            f"({', '.join(info['connections'][:3])}{' ...' if len(info['connections']) > 3 else ''}): "
            "the environment's 0, not necessarily the agent's"
            for task, info in (summary.get("network") or {}).get("zeros_suspect", {}).items()
        ),
        *(
            [
                f"resumed at a checkpoint: {counts['resumed_at_checkpoint']} episode(s); "
                f"steps played again after interruptions: {counts['steps_replayed']}"
            ]
            if "resumed_at_checkpoint" in counts
            else []
        ),
        f"start states identical: {summary['start_states_identical']}; "
        f"{_fmt(throughput['episodes_per_s'], 1)} episodes/s over {_fmt(throughput['wall_s'], 1)} s",
        *([f"STOPPED: {summary['stopped']}"] if summary.get("stopped") else []),
    ]
    return "\n".join(lines)


def _reward_figures(frame: pd.DataFrame, ks: Sequence[int], by_task: dict[str, Any]) -> dict[str, Any]:
    counted = frame[~frame["outcome"].isin(UNSCORED)] if len(frame) else frame
    rewards = counted["reward"].fillna(0.0) if len(counted) else pd.Series(dtype=float)
    at_k: dict[str, float] = {}
    for k in ks:
        values = [t["pass_at_k"][str(k)] for t in by_task.values() if str(k) in t["pass_at_k"]]
        if values:
            at_k[str(k)] = float(sum(values) / len(values))
    return {
        "mean_reward": float(rewards.mean()) if len(rewards) else None,
        "pass_rate": float(counted["passed"].mean()) if len(counted) else None,
        "pass_at_k": at_k,
    }


def _network_figures(frame: pd.DataFrame) -> dict[str, Any]:
    """Connection attempts over the run, and the tasks whose verifier the network failed (with a hint)."""
    audits = [json.loads(n) for n in frame.get("network", pd.Series(dtype=object)) if isinstance(n, str)]
    figures: dict[str, Any] = {
        key: sum(int(n.get(key, 0) or 0) for n in audits)
        for key in ("attempts", "allowed", "denied", "unreachable", "bytes_up", "bytes_down")
    }
    blocked = frame[frame["outcome"].isin((NETWORK_DENIED, NETWORK_UNREACHABLE))] if len(frame) else frame
    tasks: dict[str, Any] = {}
    for row in blocked.itertuples():
        text = getattr(row, "network_failure", None)
        failure = json.loads(text) if isinstance(text, str) else {}
        entry = tasks.setdefault(str(row.task_id), {"outcome": row.outcome, "episodes": 0, "hosts": [], "hint": ""})
        entry["episodes"] += 1
        entry["hosts"] = sorted({*entry["hosts"], *failure.get("hosts", [])})
        entry["hint"] = failure.get("hint", entry["hint"])
    figures["tasks_blocked"] = tasks
    figures["zeros_suspect"] = _suspect_zeros(frame)
    return figures


def _suspect_zeros(frame: pd.DataFrame) -> dict[str, Any]:
    """Per task, the scored 0.0 episodes whose verifier had connections fail (see envs.episode.network)."""
    tasks: dict[str, Any] = {}
    if "network_suspect" not in frame.columns:
        return tasks
    for row in frame[frame["network_suspect"].notna()].itertuples():
        suspect = json.loads(row.network_suspect) if isinstance(row.network_suspect, str) else {}
        entry = tasks.setdefault(str(row.task_id), {"episodes": 0, "connections": []})
        entry["episodes"] += 1
        entry["connections"] = sorted({*entry["connections"], *suspect.get("connections", [])})
    return tasks


def _task_figures(group: pd.DataFrame, ks: Sequence[int]) -> dict[str, Any]:
    counted = group[~group["outcome"].isin(UNSCORED)]
    n, c = len(counted), int(counted["passed"].sum())
    starts = group["start_digest"].dropna()
    digest = group["task_snapshot_digest"].dropna()
    return {
        "episodes": len(group),
        **{o: int((group["outcome"] == o).sum()) for o in OUTCOMES},
        "mean_reward": float(counted["reward"].fillna(0.0).mean()) if n else None,
        "pass_at_k": {str(k): pass_at_k(n, c, k) for k in ks if 0 < k <= n},
        "mean_episode_s": float(group["episode_s"].mean()),
        "start_states_identical": bool(len(digest) == 0 or (starts == digest.iloc[0]).all()),
    }


def _percentiles(values: Any) -> dict[str, float] | None:
    if values is None:
        return None
    samples = [float(v) for v in values if v is not None and not math.isnan(v)]
    return asdict(summarize(samples)) if samples else None


def _sandbox_seconds(frame: pd.DataFrame) -> dict[str, Any]:
    """Seconds episodes held a sandbox, in all and per cloud provider (what providers bill)."""
    if frame.empty or "sandbox_s" not in frame:
        return {"total": 0.0, "by_provider": {}}
    held = frame["sandbox_s"].fillna(frame["episode_s"])
    providers = frame["provider"] if "provider" in frame else pd.Series([None] * len(frame), index=frame.index)
    by_provider = {str(name): float(held[providers == name].sum()) for name in providers.dropna().unique()}
    return {"total": float(held.sum()), "by_provider": by_provider}


def _throughput(frame: pd.DataFrame) -> dict[str, Any]:
    if frame.empty:
        return {"episodes": 0, "wall_s": 0.0, "episodes_per_s": None}
    start, end = session_clock(frame)
    spans = frame.assign(_start=start, _end=end).groupby("run_id").agg(start=("_start", "min"), end=("_end", "max"))
    wall = float((spans["end"] - spans["start"]).sum())
    return {"episodes": len(frame), "wall_s": wall, "episodes_per_s": len(frame) / wall if wall > 0 else None}


def session_clock(frame: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Each result's start and end in seconds on its session's monotonic clock (comparable only within
    one ``run_id``); ledgers written before that clock was recorded fall back to the wall clock."""
    if "session_started_s" not in frame:
        return frame["started_at"], frame["finished_at"]
    start = frame["session_started_s"].fillna(frame["started_at"])
    end = frame["session_finished_s"].fillna(frame["finished_at"])
    return start, end


def _replayed(counts: Mapping[str, Any]) -> str:
    """The attempts played again, by why (only the causes that occurred): "" when none were."""
    causes = (
        ("retried_attempts", "after an infrastructure failure"),
        ("interrupted_attempts", "after an interruption"),
        ("outage_attempts", "after failing during an outage"),
        ("superseded", "unscored results a resume played again"),
    )
    parts = [f"{counts.get(key, 0)} {why}" for key, why in causes if counts.get(key, 0)]
    return f" (attempts played again: {', '.join(parts)})" if parts else ""


def _fmt(value: Any, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _durability_counts(frame: pd.DataFrame) -> dict[str, int]:
    """With checkpoints on: the episodes that went on from a checkpoint, and the steps played twice."""
    if "checkpoints" not in frame or frame["checkpoints"].isna().all():
        return {}
    resumed = frame["resumed_from_step"].notna().sum() if "resumed_from_step" in frame else 0
    replayed = frame["steps_replayed"].fillna(0).sum() if "steps_replayed" in frame else 0
    return {"resumed_at_checkpoint": int(resumed), "steps_replayed": int(replayed)}
