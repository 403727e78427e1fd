"""Errors raised by the environments, in the snapgym tree and Gymnasium's at once.

::

    SnapgymError (pool.errors)
    ├── ConfigError
    │   ├── TaskError                      a task directory or task.toml is invalid
    │   │   └── TaskNotFoundError          no task by that id or path (LookupError)
    │   ├── DockerfileError                a Dockerfile instruction cannot be realised (pool.errors)
    │   └── AlreadyResumedError            a paused episode's handle was resumed before (exactly once)
    ├── InvalidActionError                 wrong type, too large, NUL byte (gymnasium InvalidAction, ValueError)
    └── ResetNeededError                   step before reset or after the episode ended (gymnasium ResetNeeded)
"""

from __future__ import annotations

import gymnasium.error

from pool.errors import ConfigError, DockerfileError, HostPackagesMissingError, SnapgymError

__all__ = [
    "AlreadyResumedError",
    "DockerfileError",
    "HostPackagesMissingError",
    "InvalidActionError",
    "ResetNeededError",
    "TaskError",
    "TaskNotFoundError",
]


class TaskError(ConfigError):
    """A task directory, its task.toml, or one of its fields is invalid."""


class TaskNotFoundError(TaskError, LookupError):
    """No built-in task has that id and no task directory is at that path."""


class InvalidActionError(SnapgymError, gymnasium.error.InvalidAction, ValueError):
    """The action is of the wrong type, too large, or cannot reach a shell."""


class ResetNeededError(SnapgymError, gymnasium.error.ResetNeeded):
    """step() was called before reset() or after the episode ended."""


class AlreadyResumedError(ConfigError):
    """A paused episode's handle was resumed already: each handle resumes exactly once."""
