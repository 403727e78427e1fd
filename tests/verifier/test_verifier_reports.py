"""Test reports test.sh leaves beside the reward (Terminal-Bench 2's ``pytest --ctrf /logs/verifier/ctrf.json``)
travel with the verdict and into the episode's ``verifier/`` folder; an agent cannot plant one."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import envs
from pool import LocalBackend
from tests.support.fixtures.envs_fixtures import write_task

CTRF = {"results": {"tool": {"name": "pytest"}, "summary": {"tests": 2, "passed": 1, "failed": 1}}}
WRITES_A_REPORT = f"""#!/bin/bash
mkdir -p /logs/verifier
echo '{json.dumps(CTRF)}' > /logs/verifier/ctrf.json
if [ -f /app/done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


@pytest.mark.parametrize("verification", ["strict", "shared"])
def test_the_report_comes_back_with_the_verdict(backend: LocalBackend, tmp_path: Path, verification: str) -> None:
    task = write_task(tmp_path, test_sh=WRITES_A_REPORT)
    env = gym.make("snapgym/Shell-v0", task=str(task), backend=backend, verification=verification)
    try:
        env.reset()
        env.step("touch /app/done")
        *_, info = env.step(envs.SUBMIT)
        assert json.loads(info["verifier"]["reports"]["ctrf.json"]) == CTRF
    finally:
        env.close()


def test_an_agent_cannot_plant_a_report(backend: LocalBackend, tmp_path: Path) -> None:
    """The verifier's logs are its own: a report (or a link, or a FIFO) the agent left there never shows."""
    task = write_task(tmp_path)  # its test.sh writes no report
    env = gym.make("snapgym/Shell-v0", task=str(task), backend=backend, verification="shared")
    try:
        env.reset()
        env.step("mkdir -p /logs/verifier && echo '{\"forged\": 1}' > /logs/verifier/ctrf.json; touch /app/done")
        *_, info = env.step(envs.SUBMIT)
        assert info["verifier"]["reward"] == 1.0 and info["verifier"]["reports"] == {}
    finally:
        env.close()


def test_the_runner_writes_the_report_into_the_episode_folder(tmp_path: Path, store_dir: Path) -> None:
    import benchmarks

    write_task(tmp_path / "suite", test_sh=WRITES_A_REPORT)
    outcome = benchmarks.run_benchmark(
        "suite=dir", f"suite.path={tmp_path / 'suite'}", "progress=false", "benchmark.plots=false",
        f"backend.store_dir={store_dir}", f"output_dir={tmp_path / 'run'}",
    )  # fmt: skip
    record = next(
        json.loads(line) for line in (outcome.run_dir / "ledger.jsonl").read_text().splitlines() if '"result"' in line
    )
    assert json.loads((outcome.run_dir / record["files"]["verifier_ctrf.json"]).read_text()) == CTRF
    assert "reports" not in json.loads((outcome.run_dir / record["files"]["verifier"]).read_text())
