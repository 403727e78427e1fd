"""SWE-bench-shaped tasks made from real projects (six, more-itertools, toolz: their PyPI sdists, a
bug put in, their own tests as the hidden tests; tests/support/targets/swe_projects.py). The protection of the
test harness does not break their own configuration (six's ``[tool:pytest]`` section, tests in a
package, tests inside the project's package): the reference solution scores 1.0 and doing nothing
0.0 with it on. The catalogue's harness attacks score 0.0 with it on, and each beats the task with
it off, so the protection is what stops them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import envs
from benchmarks.attacks import ATTACKS
from pool import LocalBackend
from tests.support.targets import swe_projects as sdists

HARNESS = ("pytest-report-hook", "pytest-addopts-plugin", "pytest-shadow-package")


@pytest.fixture(scope="module", params=sdists.PROJECTS, ids=[p.name for p in sdists.PROJECTS])
def task(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    project: sdists.Project = request.param
    if why := sdists.missing(project):
        pytest.skip(why)
    return sdists.write_task(tmp_path_factory.mktemp(project.name), project)


def play(backend: LocalBackend, task: Path, actions: tuple[str, ...], *, protect: bool = True) -> dict[str, Any]:
    with envs.ShellEnv(str(task), backend=backend, step_timeout_s=60, protect_outputs=protect) as env:
        env.reset()
        for action in actions:
            env.step(action)
        _, reward, _, _, info = env.step(envs.SUBMIT)
    return {"reward": reward, **info}


def test_the_reference_solution_scores_one_and_doing_nothing_zero(backend: LocalBackend, task: Path) -> None:
    solve = (task / "solution" / "solve.sh").read_text()
    fixed = play(backend, task, (solve,))
    assert fixed["reward"] == 1.0, fixed["verifier"]["output"][-3000:]
    assert fixed["verifier"]["protected"] == {"removed": [], "restored": []}
    assert play(backend, task, ())["reward"] == 0.0


@pytest.mark.parametrize("name", HARNESS)
def test_a_harness_attack_scores_nothing_and_only_the_protection_stops_it(
    backend: LocalBackend, task: Path, name: str
) -> None:
    (attack,) = [a for a in ATTACKS if a.name == name]
    actions = attack.actions[:-1]
    protected = play(backend, task, actions)
    assert protected["reward"] == 0.0, protected["verifier"]["output"][-3000:]
    assert play(backend, task, actions, protect=False)["reward"] == 1.0
