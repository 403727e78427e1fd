"""The soak's verdicts (the last window against the first) and its markdown table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.scenarios.soak.windows import Window

JUDGED = ("first_command_p50_ms", "restore_p50_ms", "own_cpu_ms_per_episode")
"""The figures whose last/first ratio must stay within the tolerance (issue 34 item 5)."""
SHOWN = ("first_command_p99_ms", "restore_p99_ms", "machine_busy_ms_per_episode", "episodes_per_s")
"""Ratios reported beside them, not judged: a p99 and the machine's busy time move with other tenants."""


def summary(
    windows: Sequence[Window], control: Window | None, *, dying_before: int, live_sandboxes: int,
    tolerance: float, cgroup_multiple: float, machine: str, method: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """summary.json's content: every window, the ratios last/first, each check and whether all passed, and the
    last window against the fresh backend's (``control``), which the verdict does not use."""
    rows = [window.as_dict() for window in windows]
    first, last = rows[0], rows[-1]
    checks = _ratio_checks(first, last, tolerance)
    added = max(row["dying_memory_cgroups"] for row in rows) - dying_before
    allowed = cgroup_multiple * live_sandboxes
    checks["dying_memory_cgroups"] = {
        "before": dying_before, "most_added": added, "live_sandboxes": live_sandboxes,
        "limit": allowed, "met": added <= allowed,
    }  # fmt: skip
    fresh = control.as_dict() if control is not None else None
    return {
        "machine": machine,
        "method": method,
        "windows": rows,
        "ratios_last_to_first": {key: _ratio(last[key], first[key]) for key in (*JUDGED, *SHOWN)},
        "checks": checks,
        "passed": all(check["met"] for check in checks.values()),
        "fresh_control": fresh,
        "ratios_last_to_fresh": {key: _ratio(last[key], fresh[key]) for key in (*JUDGED, *SHOWN)} if fresh else None,
        "checks_against_fresh": _ratio_checks(fresh, last, tolerance) if fresh else None,
        "trends": {key: trend(rows, key) for key in JUDGED},
    }


def trend(rows: Sequence[dict[str, Any]], key: str) -> dict[str, float] | None:
    """How ``key`` moved from the first window to the last, in percent of the first, with the other tenants'
    CPU per episode taken out: a least-squares fit of it on the window's index and that load over every
    window, with two standard errors of the index's part (None: under four windows, too few to fit)."""
    if len(rows) < 4:
        return None
    design = np.array([[1.0, row["index"], row["others_ms_per_episode"]] for row in rows])
    values = np.array([row[key] for row in rows])
    coef, *_ = np.linalg.lstsq(design, values, rcond=None)
    residuals = values - design @ coef
    variance = float(residuals @ residuals) / (len(rows) - 3) * np.linalg.pinv(design.T @ design)
    start = float(coef[0] + coef[2] * np.mean(design[:, 2]))  # the first window's value at the run's mean load
    span = rows[-1]["index"] - rows[0]["index"]
    if start <= 0:
        return None
    return {"percent": 100 * float(coef[1]) * span / start,
            "two_se_percent": 200 * float(np.sqrt(max(variance[1, 1], 0.0))) * span / start}  # fmt: skip


def _ratio_checks(first: dict[str, Any], last: dict[str, Any], tolerance: float) -> dict[str, dict[str, Any]]:
    """Each judged figure of ``last`` against ``first``'s, within ``1 + tolerance`` times it."""
    checks = {}
    for key in JUDGED:
        ratio = _ratio(last[key], first[key])
        checks[key] = {"first": first[key], "last": last[key], "ratio": ratio, "limit": 1.0 + tolerance,
                       "met": ratio is not None and ratio <= 1.0 + tolerance}  # fmt: skip
    return checks


def markdown(figures: dict[str, Any]) -> str:
    """The window table, then each check with its verdict."""
    head = (
        "| window | episodes | first command p50 / p99 ms | restore p50 / p99 ms | own CPU ms/episode "
        "| others' CPU ms/episode | episodes/s | memory cgroups: all (live, of them snapgym's) | processes "
        "| runner RSS MiB | most mounts / fds |"
    )
    lines = [f"Machine: {figures['machine']}.", "", head, "|---" * 11 + "|"]
    lines += [_row(str(row["index"]), row) for row in figures["windows"]]
    if figures["fresh_control"]:
        lines.append(_row("fresh backend", figures["fresh_control"]))
    lines.append("")
    for key, check in figures["checks"].items():
        verdict = "met" if check["met"] else "MISSED"
        if key == "dying_memory_cgroups":
            lines.append(
                f"dying memory cgroups on the host: at most {check['most_added']:+d} over the {check['before']} "
                f"before the first window, against {check['limit']:g} ({check['live_sandboxes']} live sandboxes)  "
                f"{verdict}"
            )
        else:
            ratio = "-" if check["ratio"] is None else f"{check['ratio']:.3f}"
            lines.append(f"{key} last/first: {ratio} (limit {check['limit']:.2f})  {verdict}")
    shown = ", ".join(
        f"{key} {value:.3f}" for key, value in figures["ratios_last_to_first"].items() if key in SHOWN and value
    )
    lines.append(f"not judged, last/first: {shown}")
    if figures["checks_against_fresh"]:
        against = ", ".join(
            f"{key} {check['ratio']:.3f} {'met' if check['met'] else 'MISSED'}"
            for key, check in figures["checks_against_fresh"].items()
            if check["ratio"] is not None
        )
        lines.append(f"not judged, last window / a fresh backend's played beside it (drift taken out): {against}")
    trends = ", ".join(
        f"{key} {trend['percent']:+.1f}% ± {trend['two_se_percent']:.1f}"
        for key, trend in figures["trends"].items()
        if trend is not None
    )
    if trends:
        lines.append(f"not judged, first window to last with the others' CPU taken out (fit, 2 s.e.): {trends}")
    lines.append("soak: " + ("PASSED" if figures["passed"] else "FAILED"))
    return "\n".join(lines)


def _row(name: str, row: dict[str, Any]) -> str:
    processes = ", ".join(f"{count} {kind}" for kind, count in row["processes"].items())
    long_lived = ", ".join(f"{kind} {most['mounts']} / {most['fds']}" for kind, most in row["long_lived"].items())
    return (
        f"| {name} | {row['episodes']} | {row['first_command_p50_ms']:.2f} / {row['first_command_p99_ms']:.2f} "
        f"| {row['restore_p50_ms']:.2f} / {row['restore_p99_ms']:.2f} | {row['own_cpu_ms_per_episode']:.2f} "
        f"| {row['others_ms_per_episode']:.2f} | {row['episodes_per_s']:.1f} | {row['memory_cgroups']} "
        f"({row['live_memory_cgroups']}, {row['live_snapgym_memory_cgroups']}) | {processes} "
        f"| {row['runner_rss_mib']:.0f} | {long_lived} |"
    )


def _ratio(last: float, first: float) -> float | None:
    return last / first if first else None
