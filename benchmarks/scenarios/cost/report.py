"""The cost scenario's figures: medians over rounds, phases as differences of segments, markdown tables."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.scenarios.cost.accounting import KERNEL_THREADS, KINDS
from benchmarks.scenarios.cost.segments import SegmentCost

PHASES = (
    ("restore", "reset", None),
    ("steps (agent's shell)", "reset+steps", "reset"),
    ("seal (strict)", "reset+steps+seal", "reset+steps"),
    ("verifier (tests in, test.sh, reward, end state)", "episode (env)", "reset+steps+seal"),
    ("runner (ledger, episode files, pool)", "episode (runner)", "episode (env)"),
    ("runner, steady state (a long run's share)", "episode (runner, steady)", "episode (env)"),
)
"""(phase, segment, segment taken off): each phase is the difference of two segments' medians."""
COLUMNS = (*KINDS, "own", "own kernel", KERNEL_THREADS, "machine busy")
KERNEL_COLUMNS = tuple(f"{kind} kernel" for kind in KINDS)
FLOOR_INSTANCE = (
    "floor: a fresh instance in C running bash -c true (mount, PID, IPC, UTS namespaces, overlay, /proc, /dev)"
)
FLOOR_PLAIN = "floor: bash -c true with no new namespace"
"""The rows :mod:`~benchmarks.scenarios.cost.floorops` adds to the operations table (named here: the scenario's
package imports this module, and must not import the one it runs with ``python -m``)."""


def summary(
    rounds: list[list[SegmentCost]], kernel_ops: dict[str, dict[str, float]], machine: str, method: dict[str, Any]
) -> dict[str, Any]:
    """Medians per segment, the phases, the ratio to the baseline, every round, the kernel operations."""
    segments = {costs[0].name: _medians(costs) for costs in zip(*rounds, strict=True)}
    phases = {phase: _minus(segments[name], segments[less] if less else None) for phase, name, less in PHASES}
    runner, baseline = segments["episode (runner)"], segments["baseline"]
    steady = segments.get("episode (runner, steady)", runner)
    return {
        "machine": machine,
        "unit": "CPU milliseconds per episode; medians over rounds",
        "segments": segments,
        "phases": phases,
        "ratio_to_baseline": {
            "own": runner["own"] / baseline["own"] if baseline["own"] else None,
            "machine_busy": runner["machine busy"] / baseline["machine busy"] if baseline["machine busy"] else None,
            "own_steady": steady["own"] / baseline["own"] if baseline["own"] else None,
        },
        "memory_cgroups": {name: value["memory cgroups added"] for name, value in segments.items()},
        "kernel_ops_us": kernel_ops,
        "floor": floor(kernel_ops, baseline, steady),
        "rounds": [[_row(cost) for cost in costs] for costs in rounds],
        "method": method,
    }


def markdown(figures: dict[str, Any]) -> str:
    """The tables: phases by process kind (all, and the kernel part), the segments, the kernel operations."""
    lines = [
        f"Machine: {figures['machine']}. {figures['unit']}.",
        "",
        _table("phase", figures["phases"], COLUMNS),
        "",
        "Of which in the kernel:",
        "",
        _table("phase", figures["phases"], KERNEL_COLUMNS),
        "",
        _table("segment", figures["segments"], (*COLUMNS, "wall", "memory cgroups added")),
        "",
    ]
    ratio = figures["ratio_to_baseline"]
    if ratio["own"] is not None:
        lines.append(
            f"Runner episode / no-isolation baseline: {ratio['own']:.2f}x of the run's own CPU, "
            f"{ratio['machine_busy']:.2f}x of the machine's busy time; in its steady state "
            f"{ratio['own_steady']:.2f}x of the run's own CPU."
        )
    at_floor = figures.get("floor")
    if at_floor:
        lines.append(
            f"A strict episode at the floor (the baseline's work and two minimal instances, see the floor rows): "
            f"{at_floor['episode_ms']:.2f} ms, {at_floor['ratio_to_baseline']:.2f}x the baseline; this run's steady "
            f"episode is {at_floor['steady_above_ms']:.2f} ms above it."
        )
    if figures["kernel_ops_us"]:
        lines += ["", "| operation | CPU µs per op | kernel threads µs per op |", "|---|---|---|"]
        for name, op in figures["kernel_ops_us"].items():
            lines.append(f"| {name} | {op['us_per_op']:.0f} | {op['kernel_threads_us_per_op']:.0f} |")
    return "\n".join(lines)


def floor(
    kernel_ops: dict[str, dict[str, float]], baseline: dict[str, float], steady: dict[str, float]
) -> dict[str, float] | None:
    """What a strict episode would cost with instances at the floor (:mod:`~benchmarks.scenarios.cost.floorops`):
    the baseline's own CPU and twice what a minimal fresh instance adds to the same command (with the kernel
    threads' share); None when the floor was not measured."""
    instance, plain = kernel_ops.get(FLOOR_INSTANCE), kernel_ops.get(FLOOR_PLAIN)
    if not instance or not plain or not baseline["own"]:
        return None
    per_instance_ms = (
        instance["us_per_op"] + instance["kernel_threads_us_per_op"]
        - plain["us_per_op"] - plain["kernel_threads_us_per_op"]
    ) / 1000  # fmt: skip
    episode_ms = baseline["own"] + 2 * per_instance_ms
    return {
        "instance_ms": per_instance_ms,
        "episode_ms": episode_ms,
        "ratio_to_baseline": episode_ms / baseline["own"],
        "steady_above_ms": steady["own"] + steady[KERNEL_THREADS] - baseline[KERNEL_THREADS] - episode_ms,
    }


def _row(cost: SegmentCost) -> dict[str, float]:
    row = {kind: cost.ms_by_kind.get(kind, 0.0) for kind in (*KINDS, KERNEL_THREADS)}
    row.update({f"{kind} kernel": cost.kernel_ms_by_kind.get(kind, 0.0) for kind in KINDS})
    row["own"] = cost.own_ms
    row["own kernel"] = sum(value for kind, value in cost.kernel_ms_by_kind.items() if kind in KINDS)
    row["machine busy"] = cost.machine_busy_ms
    row["wall"] = cost.wall_ms
    before, after = cost.memory_cgroups
    row["memory cgroups added"] = float(after - before)
    return row


def _medians(costs: Sequence[SegmentCost]) -> dict[str, float]:
    rows = [_row(cost) for cost in costs]
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


def _minus(whole: dict[str, float], part: dict[str, float] | None) -> dict[str, float]:
    return {key: whole[key] - (part[key] if part else 0.0) for key in (*COLUMNS, *KERNEL_COLUMNS)}


def _table(first: str, rows: dict[str, dict[str, float]], columns: Sequence[str]) -> str:
    head = f"| {first} | " + " | ".join(columns) + " |"
    rule = "|---" * (len(columns) + 1) + "|"
    body = [f"| {name} | " + " | ".join(f"{row[col]:.2f}" for col in columns) + " |" for name, row in rows.items()]
    return "\n".join([head, rule, *body])
