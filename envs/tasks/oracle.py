"""Run a task's reference solution in a sandbox (checking a task with it: :mod:`envs.check`)."""

from __future__ import annotations

from envs.errors import TaskError
from envs.tasks.task import Task
from envs.tasks.verifier import copy_dir_into, run_script_command
from pool.contract import Sandbox
from pool.resources import DEFAULT_TIMEOUT_S
from pool.results import ExecResult

SOLUTION_DIR = "/solution"


def run_solution(sandbox: Sandbox, task: Task, *, timeout_s: float | None = None) -> ExecResult:
    """Copy ``solution/`` to /solution and run ``solve.sh`` in the task's working directory."""
    if task.solution_dir is None:
        raise TaskError(f"task {task.id} has no solution/solve.sh")
    copy_dir_into(sandbox, task.solution_dir, SOLUTION_DIR)
    result = sandbox.exec(
        run_script_command(f"{SOLUTION_DIR}/solve.sh"),
        timeout_s=timeout_s or task.settings.agent_timeout_s or DEFAULT_TIMEOUT_S,
        cwd=task.workdir,
        env={**task.settings.environment.env, **task.settings.solution_env},
    )
    sandbox.exec(f"rm -rf {SOLUTION_DIR}", timeout_s=60)
    return result
