"""Real projects as SWE-bench-shaped targets: the protection's defaults keep their own test suites
working and still stop the harness attacks.

Each task is made from a real library's sdist (``tests.support.targets.swe_targets``: click and
MarkupSafe, with their own ``conftest.py`` fixtures and ``setup.cfg [tool:pytest]`` options) with
a bug introduced; the library's own test file that catches it is the hidden test. With the
protection's defaults on (strict mode, the default), the reference solution scores 1.0 and the
no-op agent 0.0, so the defaults do not break a legitimate suite; each harness attack of the
catalogue (``benchmarks/attacks/harness.py``) scores 0.0. The control: with
``protect_outputs=False`` the attacks that plant pytest infrastructure score 1.0 on the same task.

The sdists are fetched before the tests by ``python -m tests.support.targets.sdists`` (``.ci/run``); a
test whose sdist is not cached skips saying so (a failure under ``SNAPGYM_REQUIRE_ALL=1``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import envs
from benchmarks.attacks import Attack
from benchmarks.attacks.harness import ATTACKS as HARNESS_ATTACKS
from pool import LocalBackend
from tests.support.needs import skip_missing
from tests.support.targets.sdists import FETCH_COMMAND, cached
from tests.support.targets.swe_targets import SPECS, SweSpec, write_swe_task

CONTROL = ("pytest-report-hook", "pytest-addopts-plugin", "pytest-shadow-package")
"""The attacks that beat these tasks without the protection (the start-up hook needs the workdir on
``PYTHONPATH``, which these tasks' test.sh does not put there)."""


@pytest.fixture(scope="module", params=SPECS, ids=[spec.name for spec in SPECS])
def task(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec: SweSpec = request.param
    sdist = cached(spec.sdist)
    if sdist is None:
        skip_missing(f"{spec.sdist.filename} is not in the sdist cache: run `{FETCH_COMMAND}` first")
    return write_swe_task(tmp_path_factory.mktemp("swe-real"), spec, sdist)


@pytest.fixture(scope="module")
def env(backend: LocalBackend, task: Path) -> Iterator[envs.ShellEnv]:
    shell = envs.ShellEnv(str(task), backend=backend, step_timeout_s=60)
    yield shell
    shell.close()


def play(env: envs.ShellEnv, *actions: str) -> dict[str, Any]:
    env.reset()
    for action in actions:
        _, _, terminated, truncated, info = env.step(action)
        assert not (terminated or truncated), info
    _, reward, _, _, info = env.step(envs.SUBMIT)
    return {"reward": reward, **info}


def attack_actions(attack: Attack) -> tuple[str, ...]:
    return tuple(action for action in attack.actions if action != envs.SUBMIT)


def test_the_reference_solution_scores_one_and_doing_nothing_zero(env: envs.ShellEnv, task: Path) -> None:
    """The project's own conftest.py and pytest options are untouched by the protection's defaults."""
    solved = play(env, (task / "solution" / "solve.sh").read_text())
    assert solved["reward"] == 1.0, solved["verifier"]["output"][-3000:]
    assert solved["verifier"]["protected"] == {"removed": [], "restored": []}
    nothing = play(env)
    assert nothing["reward"] == 0.0, nothing["verifier"]["output"][-3000:]
    assert "not passed: " in nothing["verifier"]["output"]


@pytest.mark.parametrize("attack", HARNESS_ATTACKS, ids=[attack.name for attack in HARNESS_ATTACKS])
def test_a_harness_attack_scores_what_doing_nothing_scores(env: envs.ShellEnv, attack: Attack) -> None:
    result = play(env, *attack_actions(attack))
    assert result["reward"] == 0.0, result["verifier"]["output"][-3000:]
    protected = result["verifier"]["protected"]
    assert protected["removed"] or protected["restored"], protected


@pytest.mark.parametrize("name", CONTROL)
def test_without_the_protection_the_attack_is_real(backend: LocalBackend, task: Path, name: str) -> None:
    (attack,) = [attack for attack in HARNESS_ATTACKS if attack.name == name]
    with envs.ShellEnv(str(task), backend=backend, step_timeout_s=60, protect_outputs=False) as shell:
        result = play(shell, *attack_actions(attack))
    assert result["reward"] == 1.0, result["verifier"]["output"][-3000:]
