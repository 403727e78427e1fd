"""An environment's tasks: how each one is played here, and which one the next episode plays.

A task's own settings (its verification mode, its network per phase) meet the environment's
(``verification=``, ``network=``) once, in :meth:`TaskSet.setup`; :func:`check_playable` refuses a
task whose setup the sandboxes' capabilities cannot honour, before anything is built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.episode.network import NetworkSetting, effective_policies, modes_needed
from envs.tasks.task import Task
from pool.capabilities import Capabilities
from pool.errors import ConfigError
from pool.network.policy import PhasePolicies
from pool.verification import VerifyMode

TaskSampler = Callable[[np.random.Generator, Sequence[str]], str]
"""Picks the next episode's task id from the environment's task ids (sorted), with its seeded generator."""


@dataclass(frozen=True, slots=True)
class Setup:
    """How one task is played in an environment."""

    verification: VerifyMode
    """The verifier's mode: the environment's ``verification=``, else the task's own."""
    network: PhasePolicies
    """The network policy of each phase: the environment's ``network=`` over the task's own."""


class TaskSet:
    """The tasks of an environment (one unless it was given ``tasks``), each task's setup, and the next pick.

    Args:
        tasks: the loaded tasks, the first one current at the start.
        verification: the environment's ``verification=`` (None: each task's own).
        network: the environment's ``network=`` (None: each task's own).
        sampler: picks the next task (default: uniform from the environment's generator).
    """

    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        verification: str | VerifyMode | None,
        network: NetworkSetting,
        sampler: TaskSampler | None,
    ) -> None:
        self.tasks: dict[str, Task] = {t.id: t for t in tasks}
        if len(self.tasks) != len(tasks):
            raise ConfigError(f"tasks holds the same task twice: {[t.id for t in tasks]}")
        self.verification = verification
        self.network = network
        self.sampler = sampler

    def setup(self, task: Task) -> Setup:
        """How ``task`` is played here."""
        mode = VerifyMode.parse(self.verification) if self.verification is not None else task.verification
        return Setup(mode, effective_policies(task.settings.network, self.network))

    def pick(self, asked: Any, rng: np.random.Generator) -> Task:
        """The task an episode plays: the one asked for, else the sampler's pick."""
        if asked is not None:
            task = self.tasks.get(str(asked))
            if task is None:
                known = ", ".join(sorted(self.tasks))
                raise ConfigError(f"reset option task={asked!r} is not one of this environment's tasks: {known}")
            return task
        ids = sorted(self.tasks)
        picked = self.sampler(rng, ids) if self.sampler is not None else ids[int(rng.integers(len(ids)))]
        if picked not in self.tasks:
            raise ConfigError(f"task_sampler returned {picked!r}, not one of {ids}")
        return self.tasks[picked]


def check_playable(task: Task, setup: Setup, capabilities: Capabilities, where: str) -> None:
    """Refuse (ConfigError) a task whose verification or network ``where`` (the sandboxes' source) cannot give."""
    modes = capabilities.verification
    if setup.verification.value not in modes:
        raise ConfigError(
            f"{where} verifies in {', '.join(modes) or 'no'} mode(s), not "
            f"{setup.verification.value!r}; pass verification= one of those"
        )
    missing = modes_needed(setup.network) - set(capabilities.network_modes)
    if missing:
        raise ConfigError(
            f"task {task.id} needs network mode(s) {', '.join(sorted(missing))} "
            f"({setup.network.as_dict()}), but {where} enforces only {', '.join(capabilities.network_modes)} "
            f"(egress: {capabilities.egress_control}); pass network='offline' to run it without network"
        )
