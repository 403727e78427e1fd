"""Auditing a folder of the user's tasks: ``benchmark=integrity suite=dir suite.path=DIR`` names,
per task, the attacks that beat the no-op agent and how.

The folder mixes two SWE-bench-shaped tasks that differ in one line: ``hardened`` keeps the
protection's defaults, ``unhardened`` declares ``[snapgym] protected = []`` (its verifier runs
pytest on the repository as the agent left it). The audit must exit 1, name ``unhardened`` with
the conftest attack (its mode, reward 1.0 against the no-op agent's 0.0) in the printed report and
in ``summary.json``'s ``by_task``, and list ``hardened`` as held.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.envs_fixtures import write_task

REPO = Path(__file__).resolve().parents[2]

PROJECT = {
    "testbed/calc.py": "def add(a, b):\n    return a - b\n",
    "testbed/conftest.py": "import pytest\n\n\n@pytest.fixture\ndef two():\n    return 2\n",
    "testbed/tests/__init__.py": "",
}
TEST = "from calc import add\n\n\ndef test_add(two):\n    assert add(two, 2) == 4\n"
TEST_SH = textwrap.dedent("""\
    #!/bin/bash
    mkdir -p /logs/verifier
    cp /tests/test_calc.py /testbed/tests/test_calc.py
    cd /testbed
    PYTHONPATH=/testbed python3 -m pytest -rA -p no:cacheprovider tests/test_calc.py
    if [ $? -eq 0 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
""")
ATTACKS = "[pytest-report-hook,pytest-addopts-plugin]"


def write_folder(root: Path) -> Path:
    for name, toml in (("hardened", ""), ("unhardened", "[snapgym]\nprotected = []\n")):
        write_task(
            root, name, dockerfile="FROM snapgym/host\nWORKDIR /testbed\nCOPY testbed /testbed\n",
            context=PROJECT, test_sh=TEST_SH, tests={"test_calc.py": TEST}, task_toml=f'version = "1.0"\n{toml}',
            instruction="Fix calc.add in /testbed.\n", solution="sed -i 's/a - b/a + b/' /testbed/calc.py\n",
        )  # fmt: skip
    return root


def test_the_audit_names_the_unhardened_task_and_the_attack(tmp_path: Path) -> None:
    tasks, out = write_folder(tmp_path / "tasks"), tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable, "-m", "benchmarks.run", "benchmark=integrity", "suite=dir", f"suite.path={tasks}",
            f"benchmark.attacks={ATTACKS}", "benchmark.modes=[strict]", "benchmark.targets=false",
            f"backend.store_dir={tmp_path / 'store'}", f"output_dir={out}", f"hydra.run.dir={tmp_path / 'hydra'}",
            "progress=false",
        ],
        cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] is False and summary["tasks"] == ["hardened", "unhardened"]
    assert summary["by_task"]["hardened"] == []
    beats = {(beat["attack"], beat["mode"]): beat for beat in summary["by_task"]["unhardened"]}
    assert set(beats) == {("pytest-report-hook", "strict"), ("pytest-addopts-plugin", "strict")}
    hook = beats["pytest-report-hook", "strict"]
    assert (hook["mean_reward"], hook["noop_mean_reward"], hook["unscored"]) == (1.0, 0.0, 0)
    assert "unhardened: BEATEN by 2 attack plays" in done.stdout
    assert "pytest-report-hook (strict): reward 1.000 vs no-op 0.000" in done.stdout
    assert "held against every attack played: 1 of 2 tasks (hardened)" in done.stdout
