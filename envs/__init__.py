"""Gymnasium environments over snapgym sandboxes, tasks in the Harbor format, and verifiers.

>>> import gymnasium as gym, envs
>>> env = gym.make("snapgym/Shell-v0", task="log-error-count")
>>> obs, info = env.reset()            # obs["output"] is the instruction
>>> obs, reward, terminated, truncated, info = env.step("wc -l access.log")
>>> obs, reward, terminated, truncated, info = env.step(envs.SUBMIT)   # the verifier scores the end state

Importing this package registers ``snapgym/Shell-v0`` and ``snapgym/Python-v0``.
"""

from __future__ import annotations

import gymnasium as gym

from envs.base import SandboxEnv
from envs.check import TaskCheck, check_task
from envs.episode.pause import PausedEpisode
from envs.episode.state import EpisodeState
from envs.errors import (
    AlreadyResumedError,
    DockerfileError,
    HostPackagesMissingError,
    InvalidActionError,
    ResetNeededError,
    TaskError,
    TaskNotFoundError,
)
from envs.python_env import PythonEnv
from envs.rollout import Episode, Group, rollout
from envs.shell import ShellEnv
from envs.spaces.actions import SUBMIT
from envs.spaces.observations import NO_COMMAND, TIMED_OUT
from envs.spaces.text import UnicodeText
from envs.tasks.oracle import run_solution
from envs.tasks.task import Task, builtin_task_ids, builtin_tasks, load_task, load_tasks
from envs.tasks.verifier import Verdict, verify
from envs.vector import SandboxVectorEnv
from envs.wrappers import CommandPolicy, RecordTrajectory, TruncateOutput, sandbox_env

ENV_IDS = ("snapgym/Shell-v0", "snapgym/Python-v0")
"""The environments importing ``envs`` registers with Gymnasium (``gym.make(ENV_IDS[0], task=...)``)."""


def _register() -> None:
    entries = {
        "snapgym/Shell-v0": ("envs.shell:ShellEnv", "envs.vector:shell_vector_env"),
        "snapgym/Python-v0": ("envs.python_env:PythonEnv", "envs.vector:python_vector_env"),
    }
    for env_id, (entry_point, vector_entry_point) in entries.items():
        if env_id not in gym.registry:
            # nondeterministic: the start state is identical (its digest proves it), but
            # commands see time, PIDs and randomness, and info carries timings.
            gym.register(
                id=env_id, entry_point=entry_point, vector_entry_point=vector_entry_point, nondeterministic=True
            )


_register()

__all__ = [
    "AlreadyResumedError",
    "PausedEpisode",
    "ENV_IDS",
    "NO_COMMAND",
    "SUBMIT",
    "TIMED_OUT",
    "CommandPolicy",
    "DockerfileError",
    "Episode",
    "EpisodeState",
    "Group",
    "HostPackagesMissingError",
    "InvalidActionError",
    "PythonEnv",
    "RecordTrajectory",
    "ResetNeededError",
    "SandboxEnv",
    "SandboxVectorEnv",
    "ShellEnv",
    "Task",
    "TaskCheck",
    "TaskError",
    "TaskNotFoundError",
    "TruncateOutput",
    "UnicodeText",
    "Verdict",
    "builtin_task_ids",
    "builtin_tasks",
    "check_task",
    "load_task",
    "load_tasks",
    "rollout",
    "run_solution",
    "sandbox_env",
    "verify",
]
