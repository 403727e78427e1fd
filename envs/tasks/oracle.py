"""Run a task's reference solution, and check a task: the oracle scores 1, doing nothing 0."""

from __future__ import annotations

import time
from dataclasses import dataclass

from envs.errors import TaskError
from envs.tasks.task import Task
from envs.tasks.verifier import Verdict, copy_dir_into, run_script_command, verify
from pool.contract import Backend, Sandbox
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


@dataclass(frozen=True, slots=True)
class TaskCheck:
    """The outcome of checking one task."""

    task_id: str
    oracle: Verdict
    noop: Verdict
    build_s: float

    @property
    def ok(self) -> bool:
        """The reference solution scores 1.0 and doing nothing scores 0.0."""
        return self.oracle.reward == 1.0 and self.noop.reward == 0.0


def check_task(backend: Backend, task: Task) -> TaskCheck:
    """Build the task, then verify the start state and the reference solution's end state."""
    started = time.perf_counter()
    snapshot = backend.build(task.template)
    build_s = time.perf_counter() - started
    with backend.create(snapshot) as sandbox:
        noop = verify(sandbox, task, known_good=snapshot)
        sandbox.restore()
        run_solution(sandbox, task)
        oracle = verify(sandbox, task, known_good=snapshot)
    return TaskCheck(task.id, oracle, noop, build_s)
