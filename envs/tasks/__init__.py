"""Tasks in the Harbor / Terminal-Bench 2 format: on disk, verified, and checked with their oracle.

- :mod:`~envs.tasks.task`: a task directory and the built-in suite (``load_task``, ``builtin_task_ids``).
- :mod:`~envs.tasks.taskconfig`: ``task.toml``, the settings snapgym understands.
- :mod:`~envs.tasks.verifier`: the verifier, a trust boundary (its threat model is the module docstring).
- :mod:`~envs.tasks.oracle`: a task's reference solution, and the check that it scores 1 and doing nothing 0.

Nothing here knows about environments or episodes; they build on it. The names the former
``envs.tasks`` module held are still importable from here.
"""

from __future__ import annotations

from envs.tasks.oracle import TaskCheck, check_task, run_solution
from envs.tasks.task import BUILTIN_DIR, Task, builtin_task_ids, builtin_tasks, load_task, load_tasks, task_dirs
from envs.tasks.verifier import Verdict, verify

__all__ = [
    "BUILTIN_DIR",
    "Task",
    "TaskCheck",
    "Verdict",
    "builtin_task_ids",
    "builtin_tasks",
    "check_task",
    "load_task",
    "load_tasks",
    "run_solution",
    "task_dirs",
    "verify",
]
