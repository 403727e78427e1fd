"""SWE-bench-shaped tasks made from real projects' sdists (:mod:`tests.support.targets.sdists`).

Each task is laid out as SWE-bench lays out an instance: the project's source at ``/testbed``
(its own ``conftest.py``, pytest options and tests), a bug introduced by a small patch, the test
file that catches it taken out of the repository and handed to the verifier, which copies it
back, runs pytest at the repository's root with ``-rA`` and parses the log: every test of
``FAIL_TO_PASS`` must be ``PASSED``, no test may be ``FAILED`` or ``ERROR``, and at least as many
must pass as pass on the fixed project (so a run that collected less does not count). The
reference solution reverts the patch. The project runs from its source with ``PYTHONPATH``, as some
SWE-bench harnesses do: nothing is installed, nothing is downloaded at build time.
"""

from __future__ import annotations

import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.targets.sdists import CLICK, MARKUPSAFE, Sdist


@dataclass(frozen=True, slots=True)
class SweSpec:
    """One task: which sdist, which bug, which tests."""

    name: str
    sdist: Sdist
    source: str
    """The folder put on ``PYTHONPATH`` (``src`` for a src layout)."""
    patched: str
    """The file the bug is in, relative to the project's root."""
    fixed: str
    """Text of ``patched`` that the bug replaces..."""
    buggy: str
    """...with this."""
    hidden: str
    """The test file that catches the bug: out of the repository, into ``/tests``."""
    also_run: tuple[str, ...]
    """Test files left in the repository that must keep passing."""
    fail_to_pass: tuple[str, ...]
    passed_at_least: int
    """How many tests pass on the fixed project (``hidden`` and ``also_run``)."""
    instruction: str


SPECS: tuple[SweSpec, ...] = (
    SweSpec(
        name="swe-click-bool",
        sdist=CLICK,
        source="src",
        patched="src/click/types.py",
        fixed='{"1", "true", "t", "yes", "y", "on"}',
        buggy='{"1", "true", "t", "y", "on"}',
        hidden="tests/test_basic.py",
        also_run=("tests/test_options.py",),
        fail_to_pass=("tests/test_basic.py::test_boolean_conversion[yes-True]",),
        passed_at_least=168,
        instruction="The repository in /testbed is click. A boolean option given the value `yes` is "
        "refused (`'yes' is not a valid boolean`), though `y`, `true` and `on` are taken. Fix it in /testbed.\n",
    ),
    SweSpec(
        name="swe-markupsafe-escape",
        sdist=MARKUPSAFE,
        source="src",
        patched="src/markupsafe/_native.py",
        fixed='        .replace(">", "&gt;")\n',
        buggy="",
        hidden="tests/test_escape.py",
        also_run=("tests/test_markupsafe.py",),
        fail_to_pass=(
            "tests/test_escape.py::test_escape[markupsafe._native-abcd&><'\"efgh-abcd&amp;&gt;&lt;&#39;&#34;efgh]",
        ),
        passed_at_least=35,
        instruction="The repository in /testbed is MarkupSafe. `escape('a>b')` leaves the `>` as it is; "
        "it must become `&gt;`. Fix it in /testbed.\n",
    ),
)
"""The tasks, one per pinned sdist of click and MarkupSafe."""

_TEST_SH = """\
#!/bin/bash
# SWE-bench's evaluation, in shape: the hidden test file is copied into the repository, pytest runs
# at its root with -rA, and the log is parsed for the statuses of the tests that must pass.
mkdir -p /logs/verifier
cd /testbed
cp /tests/{hidden_name} {hidden}
PYTHONPATH=/testbed/{source} python3 -m pytest -rA -p no:cacheprovider {files} > /tmp/pytest.log 2>&1
cat /tmp/pytest.log
ok=1
while IFS= read -r test; do
    grep -Fxq "PASSED $test" /tmp/pytest.log || {{ echo "not passed: $test"; ok=0; }}
done < /tests/fail_to_pass.txt
grep -Eq '^(FAILED|ERROR) ' /tmp/pytest.log && {{ echo "a test failed"; ok=0; }}
passed=$(grep -c '^PASSED ' /tmp/pytest.log)
[ "$passed" -ge {at_least} ] || {{ echo "only $passed tests passed"; ok=0; }}
echo $ok > /logs/verifier/reward.txt
"""

_SOLVE_SH = """\
#!/bin/bash
cd /testbed
python3 - <<'PY'
import pathlib
path = pathlib.Path({patched!r})
text = path.read_text()
path.write_text(text.replace({anchor!r}, {restored!r}, 1))
PY
"""


def write_swe_task(root: Path, spec: SweSpec, sdist: Path, *, task_toml: str = 'version = "1.0"\n') -> Path:
    """Write ``spec``'s task folder under ``root`` from the sdist file ``sdist``; return its path."""
    task = root / spec.name
    testbed = task / "environment" / "testbed"
    _unpack(sdist, testbed)
    patched = testbed / spec.patched
    text = patched.read_text()
    if spec.fixed not in text:
        raise ValueError(f"{spec.name}: {spec.patched} of {sdist.name} lacks the text the bug replaces")
    patched.write_text(text.replace(spec.fixed, spec.buggy, 1))
    (task / "tests").mkdir(parents=True)
    hidden = testbed / spec.hidden
    shutil.move(hidden, task / "tests" / hidden.name)
    (task / "tests" / "fail_to_pass.txt").write_text("".join(f"{test}\n" for test in spec.fail_to_pass))
    files = " ".join([spec.hidden, *spec.also_run])
    (task / "tests" / "test.sh").write_text(
        _TEST_SH.format(
            hidden_name=hidden.name, hidden=spec.hidden, source=spec.source, files=files, at_least=spec.passed_at_least
        )
    )
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text(_solution(spec, text))
    (task / "environment" / "Dockerfile").write_text("FROM snapgym/host\nWORKDIR /testbed\nCOPY testbed /testbed\n")
    (task / "instruction.md").write_text(spec.instruction)
    (task / "task.toml").write_text(task_toml)
    return task


def _solution(spec: SweSpec, fixed_text: str) -> str:
    """A solve.sh that puts the fixed text back: around the removed text when the bug deletes it."""
    if spec.buggy:
        anchor, restored = spec.buggy, spec.fixed
    else:  # a deletion: anchor on the line before it
        before = fixed_text[: fixed_text.index(spec.fixed)].splitlines(keepends=True)[-1]
        anchor, restored = before, before + spec.fixed
    return _SOLVE_SH.format(patched=spec.patched, anchor=anchor, restored=restored)


def _unpack(sdist: Path, target: Path) -> None:
    """The sdist's single top folder, as ``target``."""
    scratch = target.parent / ".unpack"
    with tarfile.open(sdist) as archive:
        archive.extractall(scratch, filter="data")
    (top,) = list(scratch.iterdir())
    top.rename(target)
    scratch.rmdir()
