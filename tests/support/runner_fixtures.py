"""Helpers for tests that run the real entry point, ``python -m benchmarks.run``, in a subprocess.

Test modules load this with ``pytest_plugins = ["tests.support.runner_fixtures"]`` (which gives them the
``runner_store`` fixture) and import its helpers. It has no asserts of its own
(PYTEST_DONT_REWRITE: the test modules import it before pytest could rewrite it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.episodes.recording.ledger import RESULT, read_records

REPO = Path(__file__).resolve().parents[2]
TASK = "log-error-count"
"""The built-in task the runs play; its answer is 127 in /app/answer.txt."""
EPISODE = f"{TASK}:0"
SOLVE = "awk '$9 ~ /^5/' /app/access.log | wc -l > /app/answer.txt"
"""A command that solves TASK (the status code is field 9 of each log line)."""


@dataclass
class Run:
    """One finished runner process and the directories it wrote."""

    done: subprocess.CompletedProcess[str]
    run_dir: Path
    """``output_dir``: run.yaml, ledger.jsonl, episodes.csv, summary.json."""
    hydra_dir: Path
    """``hydra.run.dir``: Hydra's own files (kept out of the repository's outputs/)."""

    def summary(self) -> dict[str, Any]:
        """summary.json, after checking that the run exited 0."""
        if self.done.returncode != 0:
            raise AssertionError(f"the run exited {self.done.returncode}:\n{self.done.stderr[-3000:]}")
        return dict(json.loads((self.run_dir / "summary.json").read_text()))

    def ledger(self) -> list[dict[str, Any]]:
        return list(read_records(self.run_dir / "ledger.jsonl"))

    def result(self) -> dict[str, Any]:
        """The one result record of a one-episode run."""
        results = [r for r in self.ledger() if r["kind"] == RESULT]
        if len(results) != 1:
            raise AssertionError(f"expected one result record, found {results}")
        return results[0]


def run_benchmark(
    tmp_path: Path,
    store: Path | None,
    *overrides: str,
    env: Mapping[str, str] | None = None,
    name: str = "run",
    timeout_s: float = 120,
) -> Run:
    """``python -m benchmarks.run`` on TASK with ``overrides``, writing under ``tmp_path / name`` (the local
    backend's snapshots in ``store``; None for a backend without one)."""
    run_dir, hydra_dir = tmp_path / name, tmp_path / f"{name}-hydra"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            f"suite.include=[{TASK}]",
            *([f"backend.store_dir={store}"] if store is not None else []),
            f"output_dir={run_dir}",
            f"hydra.run.dir={hydra_dir}",
            "progress=false",
            "benchmark.plots=false",
            *overrides,
        ],
        cwd=REPO,
        env=dict(os.environ if env is None else env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return Run(done, run_dir, hydra_dir)


@pytest.fixture(scope="session")
def runner_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One snapshot store for the runner subprocesses, so the task is built once per session."""
    return tmp_path_factory.mktemp("runner-store")
