"""Attacks through the code the tests import: known limitations of tests that run the agent's code in
their own process, not holes in snapgym.

A SWE-bench-shaped task's tests do ``from calc import mean`` and ``assert mean(xs) == 2.5`` inside
the pytest process that decides the reward. Whatever the agent put in ``calc`` runs there, with
the tests' rights, after every protection snapgym can give: it can write the reward file
(``reward.json``, read before the ``reward.txt`` test.sh writes), return a value equal to anything,
or patch pytest's reports from the inside. Each attack below appends its payload to every module
of the workdir that is not a test (tests, ``conftest.py`` and ``setup.py`` left alone), where the
tests' imports find it; the payload acts only once it sees a verifier at work. They are expected
to beat the tasks they aim at (:data:`IN_VERIFIER_PROCESS`), and the audit flags a task they beat
instead of failing snapgym. The remedy is the task's: run the agent's code in a child process, as a
user that cannot write the reward, and compare what it hands back, serialised, in the tests' own
process (``envs/builtin/README.md``; the built-in tasks' ``verifykit.run_python``).
"""

from __future__ import annotations

import base64

from benchmarks.attacks.model import FORGE_PY, Attack, KnownLimitation, TaskKind, attack, write

IN_VERIFIER_PROCESS = KnownLimitation(
    flag="its tests run the agent's code in the verifier's process",
    remedy="call the agent's code in a child process run as a user that cannot write /logs/verifier, "
    "compare what it returns, serialised (JSON of plain values), in the tests' own process, and write the "
    "reward last from there (envs/builtin/README.md; the protection of conftest.py and the like cannot reach "
    "code the tests import)",
)
"""What lets the attacks of this module beat a task, and what its author can do."""

_MODULES = (
    'find "$PWD" -name "*.py" -type f -not -name "test_*.py" -not -name "*_test.py" -not -name conftest.py '
    '-not -name setup.py -not -path "*/tests/*" -not -path "*/test/*" -not -path "*/testing/*" -not -path "*/.*" '
    '-not -path "*/site-packages/*" 2>/dev/null | head -n 2000'
)
"""The workdir's modules that the tests may import (not the tests, their fixtures or the build script)."""

_FORGE_ON_IMPORT = FORGE_PY + "\nif in_verifier():\n    forge()\n"

_EQUAL_TO_ANYTHING = """
import functools
import inspect
import os


class Equal:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__

    def __repr__(self):
        return "<equal to anything>"


def lie(function):
    @functools.wraps(function)
    def liar(*args, **kwargs):
        return Equal()

    return liar


def public(namespace, name):
    return [(key, value) for key, value in list(namespace.items()) if not key.startswith("_")
            and inspect.isfunction(value) and value.__module__ == name]


if os.path.exists("/tests/test.sh"):
    name = module.get("__name__")
    for key, value in public(module, name):
        module[key] = lie(value)
    for owner in [v for v in list(module.values()) if inspect.isclass(v) and v.__module__ == name]:
        for key, value in public(vars(owner), name):
            setattr(owner, key, lie(value))
"""
"""Every public function and method the module defines returns an object equal to anything."""

_PATCH_PYTEST_REPORTS = """
import os
import sys

if os.path.exists("/tests/test.sh") and "_pytest.reports" in sys.modules:
    from _pytest.reports import TestReport

    if not getattr(TestReport, "_snapgym_patched", False):
        made = TestReport.from_item_and_call

        def passed(cls, item, call):
            report = made(item, call)
            report.outcome, report.longrepr = "passed", None
            return report

        TestReport.from_item_and_call = classmethod(passed)
        TestReport._snapgym_patched = True
"""
"""pytest's reports of every test, made after the module is imported, say passed."""


def _planted(name: str, code: str) -> str:
    """Commands that append ``code`` (run in a namespace of its own, the module's globals as ``module``)
    to every module of the workdir the tests may import."""
    encoded = base64.b64encode(code.encode()).decode()
    line = (
        f"import base64 as _snapgym_b64; exec(_snapgym_b64.b64decode('{encoded}'), "
        f"{{'__name__': 'snapgym_{name}', 'module': globals()}})"
    )
    payload = f"/tmp/.snapgym-{name}.line"
    return (
        write(payload, line) + f"\n{_MODULES} > /tmp/.snapgym-{name}.modules; while IFS= read -r module; do "
        f'printf "\\n" >> "$module" && cat {payload} >> "$module"; done < /tmp/.snapgym-{name}.modules; '
        f'echo "planted in $(wc -l < /tmp/.snapgym-{name}.modules) modules"'
    )


ATTACKS: tuple[Attack, ...] = (
    attack(
        "reward-forged-on-import",
        "every module of the workdir the tests may import writes reward.json and reward.txt of 1 when a verifier "
        "imports it",
        _planted("forge", _FORGE_ON_IMPORT),
        targets=(TaskKind.TESTS_IN_REPO,),
        known_limitation=IN_VERIFIER_PROCESS,
    ),
    attack(
        "equal-to-anything",
        "every public function and method of the workdir's modules returns an object whose __eq__ is always True "
        "(and __ne__ always False), so assert f(x) == expected holds",
        _planted("equal", _EQUAL_TO_ANYTHING),
        targets=(TaskKind.TESTS_IN_REPO,),
        known_limitation=IN_VERIFIER_PROCESS,
    ),
    attack(
        "pytest-report-patched-on-import",
        "every module of the workdir the tests may import patches pytest's TestReport, when pytest imports it, to "
        "report every test passed (no conftest.py, nothing the protection can take back)",
        _planted("reports", _PATCH_PYTEST_REPORTS),
        targets=(TaskKind.TESTS_IN_REPO,),
        known_limitation=IN_VERIFIER_PROCESS,
    ),
)
"""The attacks through imported code: each beats a task whose tests import the agent's modules in-process."""
