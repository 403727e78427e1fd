"""The tasks of a run: the built-in suite or a folder, filtered by id patterns."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Sequence

from envs.errors import TaskNotFoundError
from envs.tasks import Task, builtin_task_ids, load_task, load_tasks


def select_tasks(
    path: str | None, *, include: Sequence[str] = (), exclude: Sequence[str] = (), limit: int | None = None
) -> list[Task]:
    """Load the suite and keep the tasks whose ids match ``include`` and not ``exclude``.

    Raises:
        TaskNotFoundError: the folder is missing, or an ``include`` entry matches no task
            (with the closest ids), or nothing is left after filtering.
        TaskError: a task directory is invalid (the message names the file and field).
    """
    available = builtin_task_ids() if path is None else [task.id for task in load_tasks(path)]
    for pattern in include:
        if not fnmatch.filter(available, pattern):
            close = difflib.get_close_matches(pattern, available, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; the suite has {', '.join(available)}"
            raise TaskNotFoundError(f"suite.include entry {pattern!r} matches no task{hint}")
    chosen = [
        task_id
        for task_id in available
        if (not include or any(fnmatch.fnmatch(task_id, p) for p in include))
        and not any(fnmatch.fnmatch(task_id, p) for p in exclude)
    ]
    chosen = chosen[:limit] if limit is not None else chosen
    if not chosen:
        raise TaskNotFoundError("no task is left after suite.include, suite.exclude and suite.limit")
    if path is None:
        return [load_task(task_id) for task_id in chosen]
    by_id = {task.id: task for task in load_tasks(path)}
    return [by_id[task_id] for task_id in chosen]
