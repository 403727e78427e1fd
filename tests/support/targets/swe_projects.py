"""SWE-bench-shaped tasks made from real open-source projects, from their PyPI source distributions.

Each project's sdist ships its own test suite. A task holds the project at /testbed with one small
bug put in, its own test file as the hidden tests (copied into the repository by test.sh, which runs
pytest -rA at its root and checks the statuses of the named tests, as SWE-bench's harness does),
and a solution that takes the bug out. The sdists are pinned and fetched by CI before the tests run
(:mod:`tests.support.targets.sdists`: tests never reach the network); a test whose sdist is missing
skips, saying how to fetch it. Nothing of the
projects' code is kept in this repository. PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import shutil
import tarfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.support.targets.sdists import FETCH_COMMAND, MORE_ITERTOOLS, SIX, TOOLZ, Sdist, cached


@dataclass(frozen=True)
class Project:
    """A project, the bug put into it, and the tests that must pass (SWE-bench's FAIL_TO_PASS + PASS_TO_PASS)."""

    sdist: Sdist
    source: str
    """The file the bug goes into (relative to the project's root)."""
    correct: str
    buggy: str
    tests: str
    """The project's test file that catches the bug (the hidden tests)."""
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]

    @property
    def name(self) -> str:
        """The project's name on the package index."""
        return self.sdist.project


PROJECTS = (
    Project(
        SIX,
        "six.py",
        "    byte2int = operator.itemgetter(0)\n",
        "    byte2int = operator.itemgetter(-1)\n",
        "test_six.py",
        ("test_six.py::test_byte2int",),
        ("test_six.py::test_int2byte", "test_six.py::test_bytesindex"),
    ),
    Project(
        MORE_ITERTOOLS,
        "more_itertools/more.py",
        "            'default value was provided.'\n        )\n    return default\n",
        "            'default value was provided.'\n        )\n    return None\n",
        "tests/test_more.py",
        ("tests/test_more.py::FirstTests::test_default",),
        (
            "tests/test_more.py::FirstTests::test_many",
            "tests/test_more.py::FirstTests::test_one",
            "tests/test_more.py::FirstTests::test_empty",
        ),
    ),
    Project(
        TOOLZ,
        "toolz/itertoolz.py",
        "    for item in seq:\n        d[item] += 1\n    return dict(d)\n",
        "    for item in seq:\n        d[item] = 1\n    return dict(d)\n",
        "toolz/tests/test_itertoolz.py",
        ("toolz/tests/test_itertoolz.py::test_frequencies",),
        ("toolz/tests/test_itertoolz.py::test_groupby",),
    ),
)


def missing(project: Project) -> str | None:
    """Why the project's task cannot be made here (its sdist is not cached), or None."""
    if cached(project.sdist) is not None:
        return None
    return f"{project.sdist.filename} is not in the sdist cache: fetch the sdists with `{FETCH_COMMAND}` (CI does)"


def write_task(root: Path, project: Project) -> Path:
    """The task directory ``root/<name>`` made from the cached sdist."""
    task = root / project.name
    testbed = task / "environment" / "testbed"
    archive = cached(project.sdist)
    if archive is None:
        raise FileNotFoundError(missing(project))
    with tarfile.open(archive) as tar:
        tar.extractall(root / ".unpacked", filter="data")
    shutil.copytree(root / ".unpacked" / f"{project.name}-{project.sdist.version}", testbed)
    source = testbed / project.source
    text = source.read_text()
    if text.count(project.correct) != 1:
        raise AssertionError(f"{project.name}: the code the bug replaces is not found once in {project.source}")
    source.write_text(text.replace(project.correct, project.buggy))
    (task / "tests").mkdir(parents=True)
    shutil.copy(testbed / project.tests, task / "tests" / Path(project.tests).name)
    (task / "environment" / "Dockerfile").write_text("FROM snapgym/host\nWORKDIR /testbed\nCOPY testbed /testbed\n")
    (task / "instruction.md").write_text(f"The {project.name} project in /testbed has a bug that its tests "
                                         f"({project.tests}) catch. Fix the code, not the tests.\n")  # fmt: skip
    (task / "task.toml").write_text('version = "1.0"\n\n[verifier]\ntimeout_sec = 120.0\n')
    ids = " ".join((*project.fail_to_pass, *project.pass_to_pass))
    (task / "tests" / "test.sh").write_text(textwrap.dedent(f"""\
        #!/bin/bash
        # SWE-bench's evaluation, in shape: the test file put back as the project has it, the named
        # tests run with -rA at the repository's root, each one's status read from the log.
        mkdir -p /logs/verifier
        cd /testbed
        cp /tests/{Path(project.tests).name} {project.tests}
        export PYTHONPATH=/testbed
        python3 -m pytest -rA -p no:cacheprovider {ids} > /tmp/pytest.log 2>&1
        cat /tmp/pytest.log
        passed=0
        for test in {ids}; do
            grep -q "^PASSED $test\\$" /tmp/pytest.log && passed=$((passed + 1))
        done
        if [ "$passed" -eq {len(project.fail_to_pass) + len(project.pass_to_pass)} ]; then echo 1; else echo 0; fi \\
            > /logs/verifier/reward.txt
        """))  # fmt: skip
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\npython3 - <<'PY'\nimport pathlib\n"
        f"path = pathlib.Path('/testbed/{project.source}')\n"
        f"path.write_text(path.read_text().replace({project.buggy!r}, {project.correct!r}))\nPY\n"
    )
    return task
