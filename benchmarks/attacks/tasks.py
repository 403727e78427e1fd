"""Which attacks aim at which task: the kinds of each built-in task, read off its tests/test.sh.

A task outside this table (a folder of the user's) is of kind ``ANY``, plus ``SERVICE``
when it declares shared verification. The catalogue also ships its own target tasks
(``targets/``): the built-in suite has no pytest task, and Harbor / Terminal-Bench 2's
test.sh template (pytest, sourcing ``~/.local/bin/env``) is where conftest, plugin and
profile attacks matter.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.attacks.model import TaskKind
from envs.tasks import Task, load_task
from pool.verification import VerifyMode

TARGETS_DIR = Path(__file__).parent / "targets"
"""The catalogue's own target tasks."""
PYTEST_TARGET = TARGETS_DIR / "pytest-word-count"
"""Terminal-Bench 2's pytest test.sh; the expected answer is /tests/answer.txt."""
SWE_TARGET = TARGETS_DIR / "swe-calc"
"""SWE-bench's shape: the hidden tests copied into the repository, pytest at its root, the log parsed."""

_ANSWER, _CODE, _PY, _TMP, _GIT, _PYTEST, _SERVICE, _REPO = (
    TaskKind.ANSWER_IN_TESTS, TaskKind.RUNS_OUTPUT_CODE, TaskKind.PYTHON_IN_WORKDIR, TaskKind.SCRATCH_IN_TMP,
    TaskKind.GIT, TaskKind.PYTEST, TaskKind.SERVICE, TaskKind.TESTS_IN_REPO,
)  # fmt: skip

TASK_KINDS: dict[str, frozenset[TaskKind]] = {
    "bash-backup-rotate": frozenset({_CODE}),  # runs /app/rotate.sh
    "bash-batch-rename": frozenset({_ANSWER, _PY}),  # /app/photos vs the listing in /tests/expected.json
    "c-fix-segfault": frozenset({_CODE, _TMP}),  # make, the built binary, /tmp/out
    "c-write-makefile": frozenset({_CODE, _TMP}),  # the agent's Makefile
    "config-rewrite": frozenset({_ANSWER, _PY}),  # /app/app.conf vs /tests/expected.conf
    "csv-sales-summary": frozenset({_PY}),
    "find-large-files": frozenset({_ANSWER}),  # /app/large.txt vs /tests/expected.txt
    "fix-python-parser": frozenset({_CODE, _PY, _TMP}),  # PYTHONPATH=/app python3 -m unittest in /tmp
    "fix-python-stats": frozenset({_CODE, _PY, _TMP}),
    "git-recover-deleted-branch": frozenset({_GIT}),
    "git-resolve-merge-conflict": frozenset({_GIT, _TMP}),
    "git-revert-bad-commit": frozenset({_GIT}),  # git status runs before the tree is compared
    "implement-lru-cache": frozenset({_CODE, _PY, _TMP}),
    "json-merge-users": frozenset({_ANSWER, _PY}),  # /app/users.json vs /tests/expected_users.json
    "jsonl-to-csv": frozenset({_ANSWER, _PY}),  # /app/events.csv vs the rows in /tests/expected_rows.json
    "log-error-count": frozenset(),
    "service-healthcheck-port": frozenset({_SERVICE, _PY}),
    "sqlite-fix-schema": frozenset(),
    "sqlite-top-customers": frozenset(),
    "start-kv-service": frozenset({_SERVICE, _PY}),
    "top-ips": frozenset(),
    PYTEST_TARGET.name: frozenset({_PYTEST, _ANSWER}),
    SWE_TARGET.name: frozenset({_PYTEST, _REPO}),  # its tests import the repository's code: see below
}
"""Task id -> what its tests do that attacks aim at (``ANY`` is implied)."""


@dataclass(frozen=True, slots=True)
class AnswerFile:
    """An output the tests compare with a file under /tests."""

    probe: str
    """A file of the task's start state: the attack only touches tasks that have it."""
    output: str
    """The output the agent should write."""
    expected: str
    """The file under /tests it is compared with."""
    form: str = "copy"
    """How the output follows from the expected file: ``copy`` (the same bytes), ``tree`` (a folder
    rebuilt from a JSON map of path -> original name), ``csv`` (JSON rows written as CSV)."""


ANSWER_FILES: tuple[AnswerFile, ...] = (
    AnswerFile("/app/app.conf", "/app/app.conf", "/tests/expected.conf"),  # config-rewrite
    AnswerFile("/app/data/sparse.img", "/app/large.txt", "/tests/expected.txt"),  # find-large-files
    AnswerFile("/app/users_old.json", "/app/users.json", "/tests/expected_users.json"),  # json-merge-users
    AnswerFile("/app/words.txt", "/app/answer.txt", "/tests/answer.txt"),  # pytest-word-count
    AnswerFile("/app/photos", "/app/photos", "/tests/expected.json", form="tree"),  # bash-batch-rename
    AnswerFile("/app/events.jsonl", "/app/events.csv", "/tests/expected_rows.json", form="csv"),  # jsonl-to-csv
)
"""The answer files of the ANSWER_IN_TESTS tasks."""


def task_kinds(task: Task) -> frozenset[TaskKind]:
    """What the task's tests do, for choosing attacks (``ANY`` included). A task outside the table
    (a folder of the user's, audited with ``benchmark=integrity suite=dir``) whose test.sh runs
    pytest is taken for a pytest task that may run inside the agent's repository."""
    kinds = set(TASK_KINDS.get(task.id, frozenset())) | {TaskKind.ANY}
    if task.id not in TASK_KINDS and _runs_pytest(task):
        kinds |= {TaskKind.PYTEST, TaskKind.TESTS_IN_REPO}
    if task.verification is VerifyMode.SHARED:
        kinds.add(TaskKind.SERVICE)
    return frozenset(kinds)


def _runs_pytest(task: Task) -> bool:
    try:
        return "pytest" in (task.tests_dir / "test.sh").read_text(errors="replace")
    except OSError:
        return False


def target_tasks() -> list[Task]:
    """The catalogue's own target tasks, loaded."""
    return [load_task(path) for path in sorted(TARGETS_DIR.iterdir()) if (path / "task.toml").is_file()]
