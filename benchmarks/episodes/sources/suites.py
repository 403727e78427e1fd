"""The tasks of a run: the built-in suite or a folder, filtered by id patterns."""

from __future__ import annotations

import difflib
import fnmatch
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from envs.errors import HostPackagesMissingError, TaskError, TaskNotFoundError
from envs.tasks import Task, builtin_task_ids, load_task, task_dirs
from pool.errors import ConfigError, SnapgymError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Suite:
    """The tasks of a run, and the built-in ones left out because this host lacks their packages."""

    tasks: list[Task]
    skipped: dict[str, str] = field(default_factory=dict)
    """task id -> why (the apt packages to install)."""


def select_tasks(
    path: str | None,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    limit: int | None = None,
    images: Mapping[str, str] | None = None,
    strict: bool = False,
) -> Suite:
    """Load the suite and keep the tasks whose ids match ``include`` and not ``exclude``.

    When the whole suite is asked for (no ``include``), a task whose apt packages this host
    lacks, or whose directory is invalid (a broken ``task.toml``, a Dockerfile instruction
    snapgym refuses: whatever ``python -m envs.check`` reports as failing to load), is skipped
    with the reason instead of stopping the run, and the skipped tasks are listed on stderr; a
    task named in ``include`` must load, and with ``strict`` every task must.
    ``images`` maps an image to where to get it instead (see ``envs.load_task``'s ``bases``).

    Raises:
        TaskNotFoundError: the folder is missing, or an ``include`` entry matches no task
            (with the closest ids), or nothing is left after filtering.
        TaskError: a task named in ``include`` (or, with ``strict``, any task) is invalid; the message
            names the file and field.
    """
    available = _task_specs(path)
    ids = list(available)
    for pattern in include:
        if not fnmatch.filter(ids, pattern):
            close = difflib.get_close_matches(pattern, ids, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; the suite has {', '.join(ids)}"
            raise TaskNotFoundError(f"suite.include entry {pattern!r} matches no task{hint}")
    chosen = [
        task_id
        for task_id in ids
        if (not include or any(fnmatch.fnmatch(task_id, p) for p in include))
        and not any(fnmatch.fnmatch(task_id, p) for p in exclude)
    ]
    chosen = chosen[:limit] if limit is not None else chosen
    if not chosen:
        raise TaskNotFoundError("no task is left after suite.include, suite.exclude and suite.limit")
    tasks, skipped = [], {}
    for task_id in chosen:
        try:
            tasks.append(load_task(available[task_id], bases=images))
        except HostPackagesMissingError as exc:
            if include:
                raise
            skipped[task_id] = f"needs apt-get install {' '.join(exc.packages)}"
            log.warning("skipping task %s: this host lacks %s", task_id, ", ".join(exc.packages))
        except SnapgymError as exc:  # one broken directory does not stop the rest (as in envs.check)
            if include:
                raise
            if strict:
                raise TaskError(
                    f"task {task_id}: {exc} (suite.strict=true stops on an invalid task; "
                    f"skip it with suite.exclude=[{task_id}], or drop suite.strict to skip every invalid one)"
                ) from exc
            skipped[task_id] = f"invalid task: {type(exc).__name__}: {exc}"
    _announce({k: v for k, v in skipped.items() if v.startswith("invalid task")})
    if not tasks:
        raise TaskNotFoundError(f"no task of the suite can run: {skipped}")
    return Suite(tasks, skipped)


def _announce(invalid: Mapping[str, str]) -> None:
    """List the invalid tasks a run skips on stderr, where a user sees them before the first episode."""
    if not invalid:
        return
    head = (
        f"snapgym: skipping {len(invalid)} invalid task(s) (listed in summary.json; suite.strict=true stops instead):"
    )
    print(head, file=sys.stderr)
    for task_id, why in invalid.items():
        print(f"  {task_id}: {' '.join(why.split())}", file=sys.stderr)
    log.warning("skipping %d invalid task(s): %s", len(invalid), ", ".join(invalid))


def _task_specs(path: str | None) -> dict[str, str | Path]:
    """Task id -> what ``load_task`` takes, sorted by id."""
    if path is None:
        return {task_id: task_id for task_id in builtin_task_ids()}
    return {directory.resolve().name: directory for directory in task_dirs(path)}


def image_sources(entries: Sequence[str]) -> dict[str, str]:
    """``["IMAGE=SOURCE", ...]`` (``suite.images``) as a mapping.

    Raises:
        ConfigError: an entry without ``=``, or with an empty side.
    """
    found: dict[str, str] = {}
    for entry in entries:
        image, sep, source = str(entry).partition("=")
        if not sep or not image.strip() or not source.strip():
            raise ConfigError(
                f"suite.images entry {entry!r} must be IMAGE=SOURCE, e.g. python:3.13=docker-archive:/py.tar"
            )
        found[image.strip()] = source.strip()
    return found
