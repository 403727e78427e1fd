"""benchmark=soak: the scenario's smoke run on a tiny budget, and the settings it refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.scenarios.soak import report

REPO = Path(__file__).resolve().parents[2]
WINDOW_KEYS = {
    "first_command_p50_ms",
    "first_command_p99_ms",
    "restore_p50_ms",
    "restore_p99_ms",
    "own_cpu_ms_per_episode",
    "memory_cgroups",
    "live_memory_cgroups",
    "dying_memory_cgroups",
    "processes",
    "long_lived",
}


def _soak(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "benchmark=soak", *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def test_the_soak_reports_every_window_its_ratios_and_verdicts(tmp_path: Path) -> None:
    done = _soak(tmp_path, "benchmark.episodes=6", "benchmark.window=3", "benchmark.warmup_episodes=2", "pool.size=2")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    windows = summary["windows"]
    assert [window["index"] for window in windows] == [0, 1] and all(w["episodes"] == 3 for w in windows)
    for window in [*windows, summary["fresh_control"]]:
        assert set(window) >= WINDOW_KEYS
        assert 0 < window["restore_p50_ms"] < window["first_command_p50_ms"]  # the first command follows the restore
        assert window["own_cpu_ms_per_episode"] > 0 and window["processes"].get("daemon", 0) >= 1
        assert window["long_lived"]["daemon"]["mounts"] > 0 and window["long_lived"]["keepers"]["fds"] > 0
    assert set(summary["checks"]) == {"first_command_p50_ms", "restore_p50_ms", "own_cpu_ms_per_episode",
                                      "dying_memory_cgroups"}  # fmt: skip
    restore = summary["checks"]["restore_p50_ms"]
    assert restore["ratio"] == windows[1]["restore_p50_ms"] / windows[0]["restore_p50_ms"]
    assert restore["met"] == (restore["ratio"] <= 1.1)
    assert summary["checks"]["dying_memory_cgroups"]["limit"] == 4.0 * 2
    assert summary["passed"] == all(check["met"] for check in summary["checks"].values())
    assert set(summary["ratios_last_to_fresh"]) >= {"first_command_p50_ms", "restore_p50_ms"}
    assert summary["trends"] == {key: None for key in summary["checks_against_fresh"]}  # two windows: too few to fit
    table = (tmp_path / "run" / "soak.md").read_text()
    assert table.startswith("Machine: ") and "| fresh backend |" in table
    assert ("soak: PASSED" if summary["passed"] else "soak: FAILED") in table


def test_episodes_that_are_not_whole_windows_are_refused(tmp_path: Path) -> None:
    done = _soak(tmp_path, "benchmark.episodes=1500", "benchmark.window=1000")
    assert done.returncode == 2 and "set episodes to a multiple of window" in done.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


def test_the_trend_takes_the_other_tenants_load_out() -> None:
    """A figure that only follows a neighbour's load has no trend; one that grows per window has its growth."""
    loads = [8.0, 20.0, 9.0, 15.0, 7.0, 22.0, 12.0, 18.0, 6.0, 25.0]
    rows = [{"index": i, "others_ms_per_episode": load, "flat": 5 + 0.3 * load, "growing": 10 + 0.1 * i + 0.3 * load}
            for i, load in enumerate(loads)]  # fmt: skip
    assert report.trend(rows, "flat") == pytest.approx({"percent": 0.0, "two_se_percent": 0.0}, abs=1e-6)
    growing = report.trend(rows, "growing")
    assert growing is not None
    start = 10 + 0.3 * sum(loads) / len(loads)
    assert growing["percent"] == pytest.approx(100 * 0.1 * 9 / start)
    assert report.trend(rows[:3], "growing") is None
