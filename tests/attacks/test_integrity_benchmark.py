"""Smoke tests of ``python -m benchmarks.run benchmark=integrity``: the real entry point, on a tiny subset.

One run where no attack can win (it exits 0 and says so), and one on a task whose tests reward
deleting the workdir, where the attack that deletes it must be reported, loudly, as beating
the no-op agent (exit status 1). Neither depends on how the verifier is hardened. Then audits of
task folders: one names the task whose harness protection is off, one flags the task whose tests
import the agent's code as a known limitation (not a failure: exit status 0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

REWARDS_A_MISSING_WORKDIR = """#!/bin/bash
# A careless test: it rewards the absence of the start state's data file.
mkdir -p /logs/verifier
if [ -e /app/data.txt ]; then echo 0; else echo 1; fi > /logs/verifier/reward.txt
"""


@pytest.fixture(scope="module")
def integrity_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("integrity-store")


def run_integrity(tmp_path: Path, store: Path, *overrides: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable, "-m", "benchmarks.run", "benchmark=integrity", f"backend.store_dir={store}",
            f"output_dir={out}", f"hydra.run.dir={tmp_path / 'hydra'}", "progress=false", "benchmark.targets=false",
            *overrides,
        ],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    return done, out


def summary(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "summary.json").read_text()))


def test_a_run_where_no_attack_wins_exits_zero(tmp_path: Path, integrity_store: Path) -> None:
    """Attacks the verifier already withstands: both modes are played, each with its no-op baseline, and held."""
    done, out = run_integrity(
        tmp_path, integrity_store, "suite.include=[log-error-count]", "benchmark.attacks=[reward-prewritten]"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = summary(out)
    assert result["passed"] is True and result["beaten"] == []
    assert result["tasks"] == ["log-error-count"] and result["modes"] == ["strict", "shared"]
    assert [(row["attack"], row["mode"], row["verdict"]) for row in result["verdicts"]] == [
        ("reward-prewritten", "strict", "held"),
        ("reward-prewritten", "shared", "held"),
    ]
    for row in result["verdicts"]:
        assert row["mean_reward"] == row["noop_mean_reward"] == 0.0
        assert (row["scored"], row["unscored"], row["noop_unscored"]) == (1, 0, 0)
    for mode in ("strict", "shared"):  # each play is a normal evaluation with its own ledger
        for agent in ("noop", "reward-prewritten"):
            assert (out / mode / agent / "ledger.jsonl").is_file()
            played = json.loads((out / mode / agent / "summary.json").read_text())
            assert played["counts"]["scored"] == 1
    assert "reward-prewritten" in done.stdout and "0 of 2 attack plays beat the no-op agent" in done.stdout


def test_an_attack_that_beats_the_noop_agent_fails_the_run_loudly(tmp_path: Path, integrity_store: Path) -> None:
    """A task whose tests reward a missing data file: deleting the workdir beats doing nothing, in both modes."""
    task = tmp_path / "tasks" / "rewards-missing-data"
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n')
    (task / "instruction.md").write_text("Keep /app/data.txt.\n")
    (task / "tests" / "test.sh").write_text(REWARDS_A_MISSING_WORKDIR)
    (task / "environment" / "Dockerfile").write_text("FROM snapgym/host\nWORKDIR /app\nCOPY data.txt /app/\n")
    (task / "environment" / "data.txt").write_text("data\n")
    done, out = run_integrity(
        tmp_path, integrity_store, "suite=dir", f"suite.path={tmp_path / 'tasks'}",
        "benchmark.attacks=[reward-prewritten,workdir-deleted]",
    )  # fmt: skip
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])
    assert "INTEGRITY FAILURE" in done.stderr and "workdir-deleted (strict)" in done.stderr
    result = summary(out)
    assert result["passed"] is False
    assert result["beaten"] == ["workdir-deleted:strict", "workdir-deleted:shared"]
    verdicts = {(row["attack"], row["mode"]): row for row in result["verdicts"]}
    assert verdicts["reward-prewritten", "strict"]["verdict"] == "held"
    deleted = verdicts["workdir-deleted", "strict"]
    assert deleted["verdict"] == "BEATS NOOP" and deleted["beaten_tasks"] == ["rewards-missing-data"]
    assert deleted["noop_mean_reward"] == 0.0 and deleted["noop_unscored"] == 0
    assert "BEATS NOOP" in done.stdout  # the table is printed before the run fails


def test_an_audit_of_a_task_folder_names_the_unhardened_task_and_the_attack(
    tmp_path: Path, integrity_store: Path
) -> None:
    """``benchmark=integrity suite=dir``: two SWE-bench-shaped tasks, one with the default protection
    of its test harness and one that turned it off (``[snapgym] protected = []``). The audit plays the
    harness attacks on both (their test.sh runs pytest), names the unhardened task and the attack per
    task, and exits 1."""
    import shutil

    from benchmarks.attacks import SWE_TARGET

    tasks = tmp_path / "tasks"
    shutil.copytree(SWE_TARGET, tasks / "hardened")
    shutil.copytree(SWE_TARGET, tasks / "unhardened")
    toml = tasks / "unhardened" / "task.toml"
    toml.write_text(toml.read_text() + "\n[snapgym]\nprotected = []\n")
    done, out = run_integrity(
        tmp_path, integrity_store, "suite=dir", f"suite.path={tasks}", "benchmark.attacks=[pytest-report-hook]",
        "benchmark.modes=[strict]", "benchmark.verifier_timeout_s=120",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    by_task = summary(out)["by_task"]
    assert by_task["hardened"] == []
    (play,) = by_task["unhardened"]
    assert (play["attack"], play["mode"], play["reward"], play["noop_reward"]) == (
        "pytest-report-hook",
        "strict",
        1.0,
        0.0,
    )
    assert "unhardened: BEATEN by pytest-report-hook (strict: 1.000 vs no-op 0.000)" in done.stdout
    assert "hardened: held" in done.stdout


def test_an_audit_flags_a_known_limitation_apart_and_still_passes(tmp_path: Path, integrity_store: Path) -> None:
    """Attacks that beat a task by its design (its tests import the agent's code: ``Attack.known_limitation``) beat
    the SWE-bench-shaped task whose tests do, hold on a pytest task whose tests only read an answer file, and are
    reported per task with the limitation and its remedy, apart from the beats: the run still passes (exit 0)."""
    import shutil

    from benchmarks.attacks import PYTEST_TARGET, SWE_TARGET
    from benchmarks.attacks.imported import IN_VERIFIER_PROCESS

    tasks = tmp_path / "tasks"
    shutil.copytree(SWE_TARGET, tasks / "imports-agent-code")
    shutil.copytree(PYTEST_TARGET, tasks / "reads-answer-file")
    limited = ["reward-forged-on-import", "equal-to-anything"]  # in catalogue order
    done, out = run_integrity(
        tmp_path, integrity_store, "suite=dir", f"suite.path={tasks}", f"benchmark.attacks=[{','.join(limited)}]",
        "benchmark.modes=[strict]", "benchmark.verifier_timeout_s=120",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = summary(out)
    assert result["passed"] is True and result["beaten"] == []
    assert result["known_limitations"] == [f"{name}:strict" for name in limited]
    assert result["headline"] == {"attack_plays": 2, "beats_noop": 0, "known_limitation_plays": 2}
    for row in result["verdicts"]:
        assert (row["verdict"], row["beats_noop"], row["by_design"]) == ("KNOWN LIMITATION", True, True)
        assert row["beaten_tasks"] == ["imports-agent-code"] and row["tasks"] == 2
    by_task = result["by_task"]
    assert by_task["reads-answer-file"] == []
    assert [play["attack"] for play in by_task["imports-agent-code"]] == limited
    for play in by_task["imports-agent-code"]:
        assert (play["reward"], play["noop_reward"], play["by_design"]) == (1.0, 0.0, True)
        assert play["known_limitation"] == {"flag": IN_VERIFIER_PROCESS.flag, "remedy": IN_VERIFIER_PROCESS.remedy}
    assert (
        "KNOWN LIMITATION, its tests run the agent's code in the verifier's process: beaten by "
        "reward-forged-on-import (strict: 1.000 vs no-op 0.000); equal-to-anything (strict: 1.000 vs no-op 0.000)"
        in done.stdout
    )
    assert f"remedy: {IN_VERIFIER_PROCESS.remedy}" in done.stdout and "reads-answer-file: held" in done.stdout
    assert "imports-agent-code: held but for a known limitation" in done.stdout
    assert "0 of 2 attack plays beat the no-op agent, not counting 2 that beat it by the tasks' design" in done.stdout
    assert "INTEGRITY FAILURE" not in done.stderr
