"""The calibration chooses a task's verification mode: strict drops what a solution installs.

A Terminal-Bench-2-shaped task whose reference solution ``pip install``s a package from the test
index into the system interpreter and writes code in /app that imports it: strict verification
(the default) grafts only /app onto a fresh sandbox, so the package is gone and the reference
solution scores 0.0 there. Through ``python -m benchmarks.run`` the calibration then plays the task
in toolchain mode (strict, plus what the agent added where packages install), where it scores 1.0,
and says so in calibration.json, each result and summary.json; doing nothing still scores 0.0. With
``calibrate_verification=false`` the task is not played and the reason names strict mode. In the
modes chosen, the attack catalogue's attacks on the verifier (its tools on PATH, hooks in
site-packages, a conftest.py, a trojan appended to a package the tests import, ...) score what
doing nothing scores.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import envs  # noqa: F401 (registers the environments)
from benchmarks.attacks import ATTACKS, TaskKind, select_attacks
from benchmarks.episodes.calibration import TOOLCHAIN_GUARDS, in_mode, in_shared_mode
from envs import load_task
from envs.check import STRICT_CAUSE, check_one
from envs.spaces.actions import SUBMIT
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
UPGRADE_DOCKERFILE = (
    "FROM snapgym/host\nRUN python3 -m venv /opt/python\n"
    "RUN cd $(/opt/python/bin/python3 -c 'import site; print(site.getsitepackages()[0])') && "
    "mkdir -p sgeigen sgeigen-0.9.dist-info && echo 'def largest(): return 0' > sgeigen/__init__.py && "
    r"printf 'Metadata-Version: 2.1\nName: sgeigen\nVersion: 0.9\n' > sgeigen-0.9.dist-info/METADATA && "
    r"printf 'sgeigen/__init__.py,,\nsgeigen-0.9.dist-info/METADATA,,\nsgeigen-0.9.dist-info/RECORD,,\n' "
    "> sgeigen-0.9.dist-info/RECORD\n"
    "ENV PATH=/opt/python/bin:$PATH\nWORKDIR /app\n"
)
"""An image whose interpreter has sgeigen 0.9 already: the solution upgrades it to 1.0."""


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


def test_the_calibration_plays_a_task_that_installs_outside_its_outputs_in_toolchain_mode(
    published: TestInternet, suite: Path, tmp_path: Path
) -> None:
    """Both tasks, also the one that installs into the interpreter its verifier runs (which shared mode
    refuses: python-pth beats it there), are chosen into toolchain mode, the first mode after strict."""
    summary = run(published, suite, tmp_path, "oracle", "agent=oracle")
    assert summary["mean_reward"] == 1.0 and summary["counts"]["scored"] == 2, summary
    why = "calibration: the reference solution scored 0 in strict mode (it installs outside the outputs)"
    chosen_by = {"verification": "toolchain", "chosen_by": why}
    assert summary["verification_chosen"] == {TASK: chosen_by, INTERPRETER: chosen_by}, summary
    for result in results(tmp_path / "oracle"):
        assert (result["verification"], result["verification_chosen_by"], result["reward"]) == ("toolchain", why, 1.0)
        delta = result["info"]["verifier"]["install_delta"] if "info" in result else None
        assert delta is None or any("sgeigen" in path for path in delta["grafted"]), delta
    chosen = json.loads((tmp_path / "oracle" / "calibration.json").read_text())[INTERPRETER]
    assert (chosen["verification"], chosen["chosen_by"], chosen["oracle_reward"]) == ("toolchain", why, 1.0)

    summary = run(published, suite, tmp_path, "noop", "agent=noop", f"suite.include=[{TASK}]")
    assert summary["mean_reward"] == 0.0 and summary["counts"]["scored"] == 1, summary
    [result] = results(tmp_path / "noop")
    assert (result["verification"], result["verification_chosen_by"]) == ("toolchain", why)


def test_a_solution_that_upgrades_a_package_the_image_has_is_not_chosen_into_toolchain_mode(
    published: TestInternet, suite: Path, tmp_path: Path
) -> None:
    """The upgrade is dropped (the verifier sees the image's sgeigen 0.9), so toolchain mode fails its
    calibration, and shared mode is tried next (and refused here: the verifier runs that interpreter)."""
    upgrade = suite.parent / "upgrade-suite"
    if not upgrade.exists():
        task = write_task(upgrade / "upgrades")
        (task / "environment" / "Dockerfile").write_text(UPGRADE_DOCKERFILE)
        (task / "solution" / "solve.sh").write_text(VENV_SOLVE_SH.replace("sgeigen==1.0", "--upgrade sgeigen==1.0"))
    with pytest.raises(AssertionError, match="no task can be verified"):
        run(published, upgrade, tmp_path, "oracle", "agent=oracle")
    reason = json.loads((tmp_path / "oracle" / "calibration.json").read_text())["upgrades"]["reason"]
    assert reason.startswith("in strict mode, its reference solution scored 0"), reason
    assert "; in toolchain mode, its reference solution scored 0" in reason, reason
    assert "its verifier did not get what it upgraded: an upgrade of the distribution 'sgeigen'" in reason, reason
    assert "; shared mode is not chosen: the attack python-pth" in reason, reason


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


@pytest.mark.slow
@pytest.mark.parametrize("name", TOOLCHAIN_GUARDS)
def test_in_toolchain_mode_its_guards_score_what_doing_nothing_scores(
    net_local: LocalBackend, suite: Path, name: str
) -> None:
    """On the task that installs into the interpreter its verifier runs (shared mode's python-pth beats it)."""
    [attack] = select_attacks([name])
    task = in_mode(load_task(suite / INTERPRETER), "toolchain")
    assert play(net_local, task, attack.actions) == (0.0, True)


TROJAN_TEST_SH = TEST_SH.replace("cd /app\n", "cd /app\npython3 -m pip --version >/dev/null 2>&1\n")
"""Tests that import a package the image's interpreter has (pip), as largest-eigenval's import numpy."""


@pytest.mark.slow
def test_a_trojan_appended_to_a_package_the_tests_import_beats_shared_mode_and_not_toolchain_mode(
    net_local: LocalBackend, tmp_path: Path
) -> None:
    folder = write_task(tmp_path / "imports-pip")
    (folder / "environment" / "Dockerfile").write_text(VENV_DOCKERFILE)
    (folder / "tests" / "test.sh").write_text(TROJAN_TEST_SH)
    task = load_task(folder)
    [trojan] = select_attacks(["site-packages-trojan"])
    assert play(net_local, in_shared_mode(task), trojan.actions) == (1.0, True)
    assert play(net_local, in_mode(task, "toolchain"), trojan.actions) == (0.0, True)


def test_the_episode_info_names_what_the_toolchain_verifier_got(net_local: LocalBackend, suite: Path) -> None:
    """info["verifier"]["install_delta"]: the package installed grafted, a hook beside it dropped with its rule."""
    task = in_mode(load_task(suite / INTERPRETER), "toolchain")
    hook = "python3 -c 'import site; print(site.getsitepackages()[0])' | xargs -I{} sh -c 'echo import os > {}/zz.pth'"
    env = gym.make("snapgym/Shell-v0", task=task, backend=net_local, step_timeout_s=60.0, max_steps=4)
    try:
        env.reset()
        env.step(f"bash -c {shlex.quote(VENV_SOLVE_SH)}")
        env.step(hook)
        _, reward, _, _, info = env.step(SUBMIT)
    finally:
        env.close()
    delta = info["verifier"]["install_delta"]
    assert reward == 1.0 and info["verifier"]["mode"] == "toolchain", info["verifier"]
    assert any(path.endswith("/site-packages/sgeigen.py") for path in delta["grafted"]), delta
    assert [d["rule"] for d in delta["dropped"] if d["path"].endswith("/zz.pth")] == [
        "a start-up hook (*.pth) that every Python would run"
    ], delta
