"""Helpers for the envs tests: small task directories written into a temporary folder."""

from __future__ import annotations

from pathlib import Path

TASK = "log-error-count"
"""The stable built-in task most tests run."""
ANSWER = "127"
"""log-error-count's right answer, to be written to /app/answer.txt."""
SOLVE = f"echo {ANSWER} > /app/answer.txt"

BASE_DOCKERFILE = "FROM snapgym/host\nWORKDIR /app\n"
PASS_IF_DONE = """#!/bin/bash
mkdir -p /logs/verifier
if [ -f /app/done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def write_task(
    root: Path,
    name: str = "tiny",
    *,
    dockerfile: str | None = BASE_DOCKERFILE,
    context: dict[str, str | bytes] | None = None,
    task_toml: str = 'version = "1.0"\n',
    test_sh: str = PASS_IF_DONE,
    tests: dict[str, str] | None = None,
    instruction: str = "Create the file /app/done.\n",
    solution: str | None = "touch /app/done\n",
) -> Path:
    """Write a task directory ``root/name`` in the Harbor layout and return its path.

    ``context`` maps paths under ``environment/`` to file contents; ``tests``
    adds files next to ``tests/test.sh``. Passing ``dockerfile=None`` leaves the
    environment without a Dockerfile.
    """
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir()
    (task / "instruction.md").write_text(instruction)
    (task / "task.toml").write_text(task_toml)
    (task / "tests" / "test.sh").write_text(test_sh)
    for relative, content in (tests or {}).items():
        (task / "tests" / relative).write_text(content)
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    for relative, data in (context or {}).items():
        target = task / "environment" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            target.write_bytes(data)
        else:
            target.write_text(data)
    if solution is not None:
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(solution)
    return task
