"""What a scenario hands back, and how it is written and printed."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from benchmarks.reports.stats import summarize

SUMMARY_FILE = "summary.json"
SAMPLES_FILE = "samples.csv"


@dataclass(frozen=True, slots=True)
class Skipped:
    """A method that was not measured, and why."""

    reason: str
    """A sentence a reader can act on (e.g. how to make it run)."""


@dataclass(frozen=True, slots=True)
class Target:
    """A goal checked against a measured value."""

    name: str
    """Key in summary.json, e.g. ``restore_p50_ms``."""
    description: str
    """The goal in words, e.g. ``restore p50 <= 5 ms``."""
    limit: float
    """The threshold."""
    value: float | None
    """The measured value; None when its method was skipped."""
    at_most: bool = True
    """True: met when value <= limit; False: met when value >= limit."""

    @property
    def met(self) -> bool | None:
        """Whether the goal was met; None when there is no value."""
        if self.value is None:
            return None
        return self.value <= self.limit if self.at_most else self.value >= self.limit


@dataclass(frozen=True, slots=True)
class Report:
    """The outcome of one scenario run."""

    scenario: str
    """Scenario name."""
    methods: Mapping[str, Sequence[float] | Skipped]
    """Latency samples in ms per method, in presentation order, or why it was skipped."""
    ratios: Mapping[str, float | None] = field(default_factory=dict)
    """Derived speed-ups; None when a method they need was skipped."""
    targets: Sequence[Target] = ()
    """Goals and whether they were met."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """Context: host, versions, config, snapshot id (JSON-ready)."""
    headline: Mapping[str, float | None] = field(default_factory=dict)
    """Extra figures a multirun compares (besides each method's p50 and each target's value)."""

    def write(self, output_dir: Path) -> Path:
        """Write summary.json and samples.csv; returns the summary path."""
        return write(self, output_dir)

    def table(self) -> str:
        """The terminal table."""
        return format_table(self)


def summary(report: Report) -> dict[str, Any]:
    """The JSON-ready summary: percentiles per method, ratios, targets, meta."""
    methods: dict[str, Any] = {}
    for name, outcome in report.methods.items():
        if isinstance(outcome, Skipped):
            methods[name] = {"skipped": True, "reason": outcome.reason}
        else:
            methods[name] = {"skipped": False, **asdict(summarize(outcome))}
    targets = {
        t.name: {"description": t.description, "limit": t.limit, "value": t.value, "met": t.met} for t in report.targets
    }
    headline: dict[str, Any] = {f"{name}_p50_ms": m.get("p50_ms") for name, m in methods.items()}
    headline.update({name: target["value"] for name, target in targets.items()})
    headline.update(report.headline)
    return {
        "scenario": report.scenario,
        "methods": methods,
        "ratios": dict(report.ratios),
        "targets": targets,
        "meta": dict(report.meta),
        "headline": headline,
    }


def write(report: Report, output_dir: Path) -> Path:
    """Write ``summary.json`` and ``samples.csv`` into ``output_dir``; returns the summary path."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / SUMMARY_FILE
    path.write_text(json.dumps(summary(report), indent=2, sort_keys=False) + "\n")
    samples_frame(report).to_csv(output_dir / SAMPLES_FILE, index=False)
    return path


def samples_frame(report: Report) -> pd.DataFrame:
    """Raw samples in long form: method, iteration, latency_ms."""
    rows = [
        (name, index, value)
        for name, outcome in report.methods.items()
        if not isinstance(outcome, Skipped)
        for index, value in enumerate(outcome)
    ]
    return pd.DataFrame(rows, columns=["method", "iteration", "latency_ms"])


def format_table(report: Report) -> str:
    """A plain-text table of the summary for the terminal."""
    columns = ("n", "p50_ms", "p90_ms", "p99_ms", "mean_ms")
    rows, notes = {}, []
    for name, entry in summary(report)["methods"].items():
        if entry["skipped"]:
            rows[name] = ["-"] * len(columns)
            notes.append(f"{name} skipped: {entry['reason']}")
        else:
            rows[name] = [str(entry["n"]), *(f"{entry[column]:.2f}" for column in columns[1:])]
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=list(columns))
    lines = [f"== {report.scenario} ==", frame.to_string(), *notes]
    if report.ratios:
        lines.append("ratios: " + ", ".join(f"{k} = {_ratio(v)}" for k, v in report.ratios.items()))
    for target in report.targets:
        verdict = {True: "met", False: "MISSED", None: "n/a"}[target.met]
        value = "-" if target.value is None else f"{target.value:.2f}"
        lines.append(f"target {target.description:<36} value {value:>8}  {verdict}")
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.1f}x"
