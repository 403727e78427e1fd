"""Smoke tests of the benchmark runner: the real entry point, as a user runs it, on a tiny budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
METHODS = {"restore", "restore_immediate", "create", "exec_true", "fork16", "naive_copy", "docker_recreate"}
TINY_BUDGET = [
    "benchmark.warmup=1",
    "benchmark.repetitions.restore=3",
    "benchmark.repetitions.restore_immediate=2",
    "benchmark.repetitions.create=2",
    "benchmark.repetitions.exec_true=3",
    "benchmark.repetitions.fork16=1",
    "benchmark.repetitions.naive_copy=2",
    "benchmark.repetitions.docker_recreate=1",
    "benchmark.workspace.n_files=20",
    "benchmark.workspace.mean_file_bytes=2000",
]


def run_benchmark(*overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.run", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_reset_latency_reports_every_method(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = run_benchmark(
        "benchmark=reset_latency", *TINY_BUDGET, f"backend.store_dir={tmp_path / 'store'}", f"hydra.run.dir={out}"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == METHODS
    for name, entry in summary["methods"].items():
        if entry["skipped"]:
            assert name == "docker_recreate", f"{name} skipped: {entry['reason']}"
            assert entry["reason"]
        else:
            assert entry["n"] >= 1
            assert 0 < entry["p50_ms"] <= entry["p90_ms"] <= entry["p99_ms"]
    assert set(summary["ratios"]) == {"restore_vs_docker", "restore_vs_naive"}
    assert summary["ratios"]["restore_vs_naive"] > 0
    assert {"restore_p50_ms", "restore_p99_ms", "exec_true_p50_ms", "fork16_p50_ms"} <= set(summary["targets"])
    assert (out / "samples.csv").read_text().startswith("method,iteration,latency_ms")
    assert "docker_recreate" in done.stdout


@pytest.mark.parametrize("override", ["benchmark.repetitonz=3", "+benchmark.repetitonz=3"])
def test_mistyped_key_fails_before_any_sandbox(tmp_path: Path, override: str) -> None:
    store = tmp_path / "store"
    done = run_benchmark(override, f"backend.store_dir={store}", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode != 0
    assert "benchmark.repetitonz" in done.stderr
    assert not store.exists()
    assert not (tmp_path / "run" / "summary.json").exists()


def test_pool_benchmark_reports_every_method(tmp_path: Path) -> None:
    """benchmark=pool runs through a real Ray pool and reports latency, overhead, capacity and memory."""
    out = tmp_path / "run"
    done = run_benchmark(
        "benchmark=pool",
        "benchmark.warmup=1",
        "benchmark.min_warm=2",
        "benchmark.repetitions.acquire=5",
        "benchmark.repetitions.reset=5",
        "benchmark.repetitions.exec=5",
        "benchmark.capacity.sandboxes=8",
        f"backend.store_dir={tmp_path / 'store'}",
        f"hydra.run.dir={out}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == {"acquire", "reset", "exec_lease", "exec_direct"}
    assert all(entry["n"] == 5 for entry in summary["methods"].values())
    assert summary["meta"]["capacity"]["ready"] == 8
    assert summary["meta"]["capacity"]["memory_per_sandbox_mib"] is not None
    assert summary["meta"]["pool_stats"]["acquires"] >= 10
    assert set(summary["targets"]) == {"acquire_p50_ms", "exec_overhead_ms", "warm_sandboxes", "memory_per_sandbox_mib"}
