"""The calibration chooses a task's verification mode: strict drops what a solution installs.

A Terminal-Bench-2-shaped task whose reference solution ``pip install``s a package from the test
index into the system interpreter and writes code in /app that imports it: strict verification
(the default) grafts only /app onto a fresh sandbox, so the package is gone and the reference
solution scores 0.0 there. Through ``python -m benchmarks.run`` the calibration then plays the task
in shared mode, where it scores 1.0, and says so in calibration.json, each result and summary.json;
doing nothing still scores 0.0. With ``calibrate_verification=false`` the task is not played and the
reason names strict mode. In the mode chosen, the attack catalogue's attacks on the verifier (its
tools on PATH, hooks in site-packages, a conftest.py, ...) score what doing nothing scores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import envs  # noqa: F401 (registers the environments)
from benchmarks.attacks import ATTACKS, TaskKind
from benchmarks.episodes.calibration import in_shared_mode
from envs import load_task
from envs.check import STRICT_CAUSE, check_one
from pool import LocalBackend
from tests.support.backends import LIMITS
from tests.support.fixtures.net_fixtures import TestInternet, egress_options, publish_wheel
from tests.support.fixtures.runner_fixtures import REPO

pytest_plugins = ["tests.support.fixtures.net_fixtures"]

SOLVE_SH = """\
#!/bin/bash
# As largest-eigenval's solution does: install a package outside the outputs, then code in /app that imports it.
python3 -m pip install -q --index-url https://pypi.org/simple --target /opt/sgeigen sgeigen==1.0
cat > /app/eigen.py <<'PY'
import sys
sys.path.insert(0, "/opt/sgeigen")
import sgeigen
print(sgeigen.largest())
PY
"""
TEST_SH = """\
#!/bin/bash
cd /app
if [ "$(python3 /app/eigen.py)" = "42" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
MODULE = "def largest():\n    return 42\n"
TASK = "installs-outside-outputs"
INTERPRETER = "installs-into-its-interpreter"
VENV_DOCKERFILE = """\
FROM snapgym/host
# the image's interpreter, with site-packages of its own, as python:3.13-slim's /usr/local one
RUN python3 -m venv /opt/python
ENV PATH=/opt/python/bin:$PATH
WORKDIR /app
"""
VENV_SOLVE_SH = """\
#!/bin/bash
# into the interpreter the verifier runs too: in shared mode the agent could change it (a .pth, ...)
python3 -m pip install -q --index-url https://pypi.org/simple sgeigen==1.0
printf 'import sgeigen\\nprint(sgeigen.largest())\\n' > /app/eigen.py
"""


def write_task(folder: Path) -> Path:
    """The task in Harbor's layout: the agent's turn may use the network (Harbor's default), the verifier not."""
    for part in ("environment", "tests", "solution"):
        (folder / part).mkdir(parents=True)
    (folder / "instruction.md").write_text("Print the largest eigenvalue with /app/eigen.py.\n")
    (folder / "task.toml").write_text(
        'version = "1.0"\n\n[verifier]\ntimeout_sec = 60.0\nnetwork_mode = "no-network"\n\n[environment]\n'
    )
    (folder / "environment" / "Dockerfile").write_text("FROM snapgym/host\nWORKDIR /app\n")
    (folder / "tests" / "test.sh").write_text(TEST_SH)
    (folder / "solution" / "solve.sh").write_text(SOLVE_SH)
    return folder


@pytest.fixture(scope="module")
def published(internet: TestInternet) -> TestInternet:
    publish_wheel(internet, "sgeigen", "1.0", MODULE)
    return internet


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("suite")
    write_task(folder / TASK)
    venv = write_task(folder / INTERPRETER)
    (venv / "environment" / "Dockerfile").write_text(VENV_DOCKERFILE)
    (venv / "solution" / "solve.sh").write_text(VENV_SOLVE_SH)
    return folder


def run(internet: TestInternet, suite: Path, out: Path, name: str, *overrides: str) -> dict[str, Any]:
    hosts = ",".join(f'"{host}={address}"' for host, address in internet.hosts.items())
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "suite=dir", f"suite.path={suite}",
         f"backend.store_dir={out / 'store'}", f"backend.egress.hosts=[{hosts}]",
         f"backend.egress.trusted_networks=[{internet.network}]",
         f"backend.egress.extra_ca_files=[{internet.ca.cert_path}]", "progress=false", "benchmark.plots=false",
         f"output_dir={out / name}", f"hydra.run.dir={out / (name + '-hydra')}", *overrides],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "SNAPGYM_CALIBRATION_DIR": str(out / "calibrations")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / name / "summary.json").read_text())  # type: ignore[no-any-return]


def results(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "ledger.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record.get("kind") == "result"]


def test_the_calibration_plays_a_task_that_installs_outside_its_outputs_in_shared_mode(
    published: TestInternet, suite: Path, tmp_path: Path
) -> None:
    summary = run(published, suite, tmp_path, "oracle", "agent=oracle")
    assert summary["mean_reward"] == 1.0 and summary["counts"]["scored"] == 1, summary
    refused = summary["skipped_tasks"][INTERPRETER]  # its verifier's interpreter is the one the agent installs into
    assert refused.startswith("calibration: in strict mode, its reference solution scored 0"), refused
    assert "shared mode is not chosen: the attack python-pth scored above doing nothing" in refused
    why = "calibration: the reference solution scored 0 in strict mode (it installs outside the outputs)"
    assert summary["verification_chosen"] == {TASK: {"verification": "shared", "chosen_by": why}}
    [result] = results(tmp_path / "oracle")
    assert (result["verification"], result["verification_chosen_by"], result["reward"]) == ("shared", why, 1.0)
    chosen = json.loads((tmp_path / "oracle" / "calibration.json").read_text())[TASK]
    assert (chosen["verification"], chosen["chosen_by"], chosen["oracle_reward"]) == ("shared", why, 1.0)

    summary = run(published, suite, tmp_path, "noop", "agent=noop", f"suite.include=[{TASK}]")
    assert summary["mean_reward"] == 0.0 and summary["counts"]["scored"] == 1, summary
    [result] = results(tmp_path / "noop")
    assert (result["verification"], result["verification_chosen_by"]) == ("shared", why)


def test_with_the_choice_off_the_strict_zero_is_reported_naming_the_mode(
    published: TestInternet, suite: Path, tmp_path: Path
) -> None:
    for agent in ("oracle", "noop"):
        with pytest.raises(AssertionError, match="no task can be verified"):
            run(
                published,
                suite,
                tmp_path,
                agent,
                f"agent={agent}",
                "calibrate_verification=false",
                f"suite.include=[{TASK}]",
            )
    calibration = json.loads((tmp_path / "noop" / "calibration.json").read_text())[TASK]
    assert calibration["oracle_reward"] == 0.0 and calibration["verification"] is None
    assert "strict mode is the likely cause" in calibration["reason"], calibration


@pytest.fixture(scope="module")
def net_local(published: TestInternet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    store = tmp_path_factory.mktemp("store")
    with LocalBackend(store_dir=store, **LIMITS, egress=egress_options(published)) as backend:
        yield backend


def test_envs_check_names_strict_mode_after_a_strict_zero_of_an_installing_solution(
    net_local: LocalBackend, suite: Path
) -> None:
    """envs.check's one-line reason for the strict 0 says the mode is the likely cause (not only "see --verbose")."""
    report = check_one(net_local, str(suite / TASK))
    assert (report.oracle, report.noop) == ("fail", "ok"), report
    assert report.reason.startswith("oracle scored 0.0") and report.reason.endswith(STRICT_CAUSE), report.reason
    assert "No module named 'sgeigen'" in report.details["oracle"]


AIMED = frozenset({TaskKind.ANY, TaskKind.RUNS_OUTPUT_CODE, TaskKind.PYTHON_IN_WORKDIR, TaskKind.SERVICE})
"""What this task's tests do, as the catalogue names it (SERVICE: it is verified in shared mode)."""
CASES = [a for a in ATTACKS if a.aims_at(AIMED) and not a.through_outputs]
"""The attacks on the verifier itself; one that works through code the tests run from the outputs is
the task's test script's to stop (the catalogue's ``through_outputs``), in either mode."""


def play(backend: LocalBackend, task: Any, actions: list[str] | tuple[str, ...]) -> tuple[float | None, bool]:
    env = gym.make("snapgym/Shell-v0", task=task, backend=backend, step_timeout_s=60.0, max_steps=len(actions) + 1)
    try:
        env.reset()
        reward, info = 0.0, {}
        for action in actions:
            _, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        return float(reward), bool(info.get("scored"))
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("attack", CASES, ids=lambda a: a.name)
def test_in_the_chosen_mode_an_attack_on_the_verifier_scores_what_doing_nothing_scores(
    net_local: LocalBackend, suite: Path, attack: Any
) -> None:
    task = in_shared_mode(load_task(suite / TASK))
    assert play(net_local, task, attack.actions) == (0.0, True)
