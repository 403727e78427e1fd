"""Tasks in the Harbor / Terminal-Bench 2 format: on disk, verified, and checked with their oracle.

- :mod:`~envs.tasks.task`: a task directory and the built-in suite (``load_task``, ``builtin_task_ids``).
- :mod:`~envs.tasks.taskconfig`: ``task.toml``, the settings snapgym understands.
- :mod:`~envs.tasks.verifier`: the verifier, a trust boundary (its threat model is the module docstring).
- :mod:`~envs.tasks.oracle`: a task's reference solution, and the check that it scores 1 and doing nothing 0.

Nothing here knows about environments or episodes; they build on it. This face re-exports what
the former ``envs.tasks`` module held, so ``from envs.tasks import Task, load_task`` still works.
"""

from __future__ import annotations

from envs.tasks.task import BUILTIN_DIR, Task, builtin_task_ids, builtin_tasks, load_task, load_tasks, task_dirs

__all__ = ["BUILTIN_DIR", "Task", "builtin_task_ids", "builtin_tasks", "load_task", "load_tasks", "task_dirs"]
