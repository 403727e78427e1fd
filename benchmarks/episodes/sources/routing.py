"""One run over two backends: tasks that ask for GPUs on a GPU backend, the rest on the run's backend.

``python -m benchmarks.run backend=docker gpu_backend='{name: modal, gpu: A10G}'`` plays every task
whose ``[environment] gpus`` is set on Modal and every other task on Docker, each pooled and restored
the same way (``pool=ray`` gives both a Ray pool). :class:`RoutedSupply` has the interface of
:class:`~benchmarks.episodes.sources.supply.BackendSupply` and ``PoolSupply``; the runner asks it
``for_task(task)`` where the answer depends on the task (its capabilities, the backend named in its records).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from benchmarks.episodes.sources.supply import SandboxSupply
from envs.tasks import Task
from pool import Capabilities
from pool.snapshots import Snapshot


def wants_gpu(task: Task) -> bool:
    """Whether the task asks for GPUs (``[environment] gpus``)."""
    return bool(task.template.resources.gpus)


class RoutedSupply:
    """Two supplies: ``gpu`` for tasks that ask for GPUs, ``default`` for the rest."""

    def __init__(self, default: SandboxSupply, gpu: SandboxSupply) -> None:
        self.default = default
        self.gpu = gpu
        self.kind = default.kind

    def for_task(self, task: Task) -> SandboxSupply:
        """The supply that serves ``task``."""
        return self.gpu if wants_gpu(task) else self.default

    @property
    def name(self) -> str:
        """``docker+modal``: the two backends (each result names its own)."""
        return f"{self.default.name}+{self.gpu.name}"

    @property
    def health_name(self) -> str:
        return f"{self.default.health_name} and the GPU backend"

    @property
    def health_hint(self) -> str:
        return f"{self.default.health_hint} And the GPU backend's: {self.gpu.health_hint}"

    @property
    def generation(self) -> int:
        """Changes when either supply replaced its backend or pool."""
        return self.default.generation * 1000 + self.gpu.generation

    @property
    def capabilities(self) -> Capabilities:
        """The default backend's (per task: ``for_task(task).capabilities``)."""
        return self.default.capabilities

    def build(self, task: Task) -> Snapshot:
        return self.for_task(task).build(task)

    def make_env(self, env_id: str, task: Task, **options: Any) -> gym.Env[Any, str]:
        return self.for_task(task).make_env(env_id, task, **options)

    def check_health(self) -> str | None:
        """None when both can serve; else the first reason."""
        return self.default.check_health() or self.gpu.check_health()

    def recover(self) -> None:
        self.default.recover()
        self.gpu.recover()

    def stats(self) -> dict[str, Any]:
        return {"default": self.default.stats(), "gpu": self.gpu.stats()}

    def keep_run_checkpoints(self) -> None:
        self.default.keep_run_checkpoints()
        self.gpu.keep_run_checkpoints()

    def close(self) -> None:
        try:
            self.default.close()
        finally:
            self.gpu.close()


Supply = SandboxSupply | RoutedSupply
"""Where a run's sandboxes come from: one backend (or pool), or two routed by the task's GPUs."""
