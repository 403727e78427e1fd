"""``python -m envs.check --all DIR``: one line per task with loads / builds / oracle / noop and the
reason of the first failure; one broken task never stops the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.fixtures.envs_fixtures import write_task


def _check(*args: str, store: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SNAPGYM_STORE": str(store)}
    return subprocess.run(
        [sys.executable, "-m", "envs.check", *args], capture_output=True, text=True, timeout=300, env=env
    )


def test_check_all_reports_every_stage_of_every_task(tmp_path: Path) -> None:
    """A good task, one that does not load, one that does not build, one whose oracle fails and one
    that passes without work: each gets its line and reason, and the run exits 1."""
    suite = tmp_path / "suite"
    write_task(suite, "a-good")
    write_task(suite, "b-bad-toml", task_toml="[environment]\nmemory = 'lots'\n")
    write_task(suite, "c-bad-build", dockerfile="FROM snapgym/host\nRUN echo broken >&2; exit 3\n")
    write_task(suite, "d-wrong-solution", solution="true\n")
    always = "#!/bin/bash\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n"
    write_task(suite, "e-free-reward", test_sh=always)
    report = tmp_path / "report.jsonl"
    done = _check("--all", str(suite), "--json", str(report), store=tmp_path / "store")
    assert done.returncode == 1, done.stderr
    lines = {line.split()[1]: line for line in done.stdout.splitlines() if line.startswith(("ok", "FAIL"))}
    assert lines["a-good"].startswith("ok") and "loads=ok builds=ok oracle=ok noop=ok" in lines["a-good"]
    assert "loads=fail builds=-" in lines["b-bad-toml"] and "environment.memory" in lines["b-bad-toml"]
    assert "loads=ok builds=fail" in lines["c-bad-build"] and "exited 3" in lines["c-bad-build"]
    assert "oracle=fail" in lines["d-wrong-solution"] and "oracle scored 0.0" in lines["d-wrong-solution"]
    assert "noop=fail" in lines["e-free-reward"] and "do not check the task" in lines["e-free-reward"]
    assert "1 of 5 tasks pass" in done.stdout
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    assert [row["task"] for row in rows] == ["a-good", "b-bad-toml", "c-bad-build", "d-wrong-solution", "e-free-reward"]


def test_check_names_a_missing_folder_and_an_unknown_backend(tmp_path: Path) -> None:
    """Bad input is one clear line on stderr and exit 2, before any sandbox starts."""
    missing = _check("--all", str(tmp_path / "nowhere"), store=tmp_path / "store")
    assert missing.returncode == 2 and "no task folder at" in missing.stderr
    wrong = _check("--backend", "dokcer", store=tmp_path / "store")
    assert wrong.returncode == 2 and "did you mean 'docker'?" in wrong.stderr
