"""The harness-level exploits of SWE-bench-shaped tasks score what doing nothing scores.

The task is built like SWE-bench: a Python project at /testbed with its own ``conftest.py`` and
pytest configuration; test.sh copies the hidden tests into the repository and runs pytest at its
root. An agent that only plants test infrastructure in the repository (a ``conftest.py`` hook that
marks every test passed, ``addopts`` in an ini file, a package shadowing pytest, a start-up hook,
a byte-code cache that holds a fix the source does not) must score 0.0, in both verification
modes, while the reference solution, and one that also edits the project's files legitimately,
score 1.0; what was removed or put back is in ``info["verifier"]["protected"]``. Each exploit is
shown to beat these tests without the protection.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import envs
from pool import LocalBackend
from tests.support.fixtures.envs_fixtures import write_task

HOOK = textwrap.dedent("""\
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        outcome = yield
        report = outcome.get_result()
        report.outcome = "passed"
        report.longrepr = None
""")
PLUGIN = "def pytest_collection_modifyitems(items):\n    items.clear()\n"  # nothing collected: exit 5
PLUGIN_PASS = HOOK

REPO = {
    "testbed/calc.py": "def add(a, b):\n    return a - b\n",
    "testbed/conftest.py": "import pytest\n\n\n@pytest.fixture\ndef two():\n    return 2\n",
    "testbed/pyproject.toml": '[project]\nname = "calc"\nversion = "0.1"\n\n'
    '[tool.pytest.ini_options]\naddopts = "-q"\n',
    "testbed/tests/__init__.py": "",
}
TEST = "from calc import add\n\n\ndef test_add(two):\n    assert add(two, 2) == 4\n"
TEST_SH = textwrap.dedent("""\
    #!/bin/bash
    mkdir -p /logs/verifier
    cp /tests/test_calc.py /testbed/tests/test_calc.py
    cd /testbed
    export PYTHONPATH=/testbed
    python3 -m pytest -p no:cacheprovider tests/test_calc.py
    if [ $? -eq 0 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
""")
FIX = "sed -i 's/a - b/a + b/' /testbed/calc.py"

EXPLOITS = {
    "conftest hook at the root": f"cat > /testbed/conftest.py <<'EOF'\n{HOOK}EOF",
    "conftest hook beside the tests": f"cat > /testbed/tests/conftest.py <<'EOF'\n{HOOK}\nimport pytest\n"
    "@pytest.fixture\ndef two():\n    return 2\nEOF",
    "pytest.ini with a plugin": f"cat > /testbed/evil.py <<'EOF'\n{PLUGIN_PASS}EOF\n"
    "printf '[pytest]\\naddopts = -p evil\\n' > /testbed/pytest.ini",
    "pyproject addopts": f"cat > /testbed/evil.py <<'EOF'\n{PLUGIN_PASS}EOF\n"
    'printf \'[project]\\nname = "calc"\\n[tool.pytest.ini_options]\\naddopts = "-p evil"\\n\' '
    "> /testbed/pyproject.toml",
    "tox.ini addopts, the pyproject section dropped": f"cat > /testbed/evil.py <<'EOF'\n{PLUGIN_PASS}EOF\n"
    "printf '[project]\\nname = \"calc\"\\n' > /testbed/pyproject.toml && "
    "printf '[pytest]\\naddopts = -p evil\\n' > /testbed/tox.ini",
    "a pytest that shadows pytest": "mkdir -p /testbed/pytest && printf 'import sys; sys.exit(0)\\n' > "
    "/testbed/pytest/__main__.py && touch /testbed/pytest/__init__.py",
    "an unchecked byte-code cache of the fix": f"cp /testbed/calc.py /tmp/orig && {FIX} && python3 -c "
    "'import py_compile as c; c.compile(\"/testbed/calc.py\", invalidation_mode=c.PycInvalidationMode.UNCHECKED_HASH)'"
    " && cp /tmp/orig /testbed/calc.py",
    "a start-up hook on PYTHONPATH": "printf 'import os\\nos._exit(0)\\n' > /testbed/sitecustomize.py",
}


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("swe")
    return write_task(
        root, "swe-shaped",
        dockerfile="FROM snapgym/host\nWORKDIR /testbed\nCOPY testbed /testbed\n",
        context=REPO, test_sh=TEST_SH, tests={"test_calc.py": TEST},
        instruction="Fix calc.add in /testbed.\n", solution=FIX + "\n",
    )  # fmt: skip


@pytest.fixture(scope="module", params=["strict", "shared"])
def env(request: pytest.FixtureRequest, backend: LocalBackend, task: Path) -> Iterator[envs.ShellEnv]:
    shell = envs.ShellEnv(str(task), backend=backend, verification=request.param, step_timeout_s=30)
    yield shell
    shell.close()


def play(env: envs.ShellEnv, *actions: str) -> dict[str, Any]:
    env.reset()
    for action in actions:
        _, _, terminated, truncated, info = env.step(action)
        assert not (terminated or truncated), info
    _, reward, _, _, info = env.step(envs.SUBMIT)
    return {"reward": reward, **info}


def test_the_reference_solution_scores_one_and_doing_nothing_zero(env: envs.ShellEnv) -> None:
    assert play(env, FIX)["reward"] == 1.0
    nothing = play(env)
    assert nothing["reward"] == 0.0 and nothing["verifier"]["protected"] == {"removed": [], "restored": []}


@pytest.mark.parametrize("exploit", EXPLOITS, ids=list(EXPLOITS))
def test_a_planted_harness_scores_what_doing_nothing_scores(env: envs.ShellEnv, exploit: str) -> None:
    result = play(env, EXPLOITS[exploit])
    assert result["reward"] == 0.0, result["verifier"]["output"][-2000:]
    protected = result["verifier"]["protected"]
    assert protected["removed"] or protected["restored"], protected


def test_the_projects_own_files_stay_the_agents_to_edit(env: envs.ShellEnv) -> None:
    """A fix that also bumps the version in pyproject.toml and adds a helper module keeps both; a
    conftest.py the agent deleted is put back (its fixture is the tests')."""
    edits = "sed -i 's/0.1/0.2/' /testbed/pyproject.toml && echo 'X = 1' > /testbed/helper.py"
    result = play(env, FIX, edits, "rm /testbed/conftest.py")
    assert result["reward"] == 1.0, result["verifier"]["output"][-2000:]
    assert result["verifier"]["protected"]["restored"] == ["/testbed/conftest.py"]


def test_a_task_can_turn_the_protection_off(backend: LocalBackend, task: Path, tmp_path: Path) -> None:
    """``[snapgym] protected = []``: the outputs as the agent left them (a task whose answer is a conftest.py)."""
    import shutil

    copy = tmp_path / "unprotected"
    shutil.copytree(task, copy)
    (copy / "task.toml").write_text('version = "1.0"\n[snapgym]\nprotected = []\n')
    with envs.ShellEnv(str(copy), backend=backend, step_timeout_s=30) as shell:
        result = play(shell, EXPLOITS["conftest hook at the root"])
    assert result["reward"] == 1.0 and result["verifier"]["protected"] == {"removed": [], "restored": []}


@pytest.mark.parametrize("exploit", EXPLOITS, ids=list(EXPLOITS))
def test_without_the_protection_the_exploit_is_real(backend: LocalBackend, task: Path, exploit: str) -> None:
    """The control: with ``protect_outputs=False`` each exploit above beats these tests (else the
    test of the protection would prove nothing)."""
    with envs.ShellEnv(str(task), backend=backend, step_timeout_s=30, protect_outputs=False) as shell:
        result = play(shell, EXPLOITS[exploit])
    assert result["reward"] == 1.0, result["verifier"]["output"][-2000:]


@pytest.mark.parametrize("name", ["pytest-report-hook", "pytest-addopts-plugin", "pytest-shadow-package"])
def test_the_catalogues_harness_attacks_beat_the_swe_target_without_the_protection(
    backend: LocalBackend, name: str
) -> None:
    """The catalogue's control: its SWE-bench-shaped target (benchmarks/attacks/targets/swe-calc) falls
    to each of these with ``protect_outputs=False``; tests/attacks shows they score nothing with it."""
    from benchmarks.attacks import ATTACKS, SWE_TARGET

    (attack,) = [a for a in ATTACKS if a.name == name]
    with envs.ShellEnv(str(SWE_TARGET), backend=backend, step_timeout_s=30, protect_outputs=False) as shell:
        result = play(shell, *attack.actions[:-1])
    assert result["reward"] == 1.0, result["verifier"]["output"][-2000:]
