"""Step N sandbox environments at once, through Gymnasium's ``VectorEnv`` API.

Each sub-environment owns a sandbox; a thread pool runs their resets and
steps concurrently (a sandbox command waits on the daemon, not on the GIL),
so N environments cost N sandboxes, not N Python processes. Episodes that
end are reset on the next step (Gymnasium's ``NEXT_STEP`` autoreset): that
step returns the new episode's first observation, reward 0, and the action
given for that sub-environment is ignored.

``gym.make_vec("snapgym/Shell-v0", num_envs=8, task="csv-sales-summary")``
builds one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from envs.base import SandboxEnv
from pool.errors import ConfigError

StepResult = tuple[Any, float, bool, bool, dict[str, Any]]


class SandboxVectorEnv(VectorEnv[Any, Any, Any]):
    """N sandbox environments stepped concurrently by threads.

    Args:
        env_fns: functions that each make one environment.
        max_workers: threads (default: one per environment).
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env[Any, Any]]], *, max_workers: int | None = None) -> None:
        if not env_fns:
            raise ConfigError("a vector environment needs at least one environment")
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        first = self.envs[0]
        self.metadata = {**first.metadata, "autoreset_mode": AutoresetMode.NEXT_STEP}
        self.render_mode = first.render_mode
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._executor = ThreadPoolExecutor(max_workers or self.num_envs, thread_name_prefix="snapgym-vec")
        self._needs_reset = np.zeros(self.num_envs, dtype=bool)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every sub-environment concurrently; an int seed gives seed, seed+1, ..."""
        if seed is None or isinstance(seed, int):
            seeds: list[int | None] = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ConfigError(f"got {len(seeds)} seeds for {self.num_envs} environments")
        results = list(
            self._executor.map(lambda i: self.envs[i].reset(seed=seeds[i], options=options), range(self.num_envs))
        )
        self._needs_reset[:] = False
        infos: dict[str, Any] = {}
        for i, (_, info) in enumerate(results):
            infos = merge_info(infos, info, i, self.num_envs)
        return self._batch([obs for obs, _ in results]), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every sub-environment concurrently (resetting those whose episode ended)."""
        per_env = list(iterate(self.action_space, actions))
        if len(per_env) != self.num_envs:
            raise ConfigError(f"got {len(per_env)} actions for {self.num_envs} environments")
        results: list[StepResult] = list(
            self._executor.map(lambda i: self._step_one(i, per_env[i]), range(self.num_envs))
        )
        rewards = np.array([r[1] for r in results], dtype=np.float64)
        terminations = np.array([r[2] for r in results], dtype=bool)
        truncations = np.array([r[3] for r in results], dtype=bool)
        self._needs_reset = terminations | truncations
        infos: dict[str, Any] = {}
        for i, result in enumerate(results):
            infos = merge_info(infos, result[4], i, self.num_envs)
        return self._batch([r[0] for r in results]), rewards, terminations, truncations, infos

    def render(self) -> tuple[Any, ...] | None:
        """Each sub-environment's render()."""
        return tuple(env.render() for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        """Close every sub-environment and the thread pool."""
        self._executor.shutdown(wait=True)
        for env in self.envs:
            env.close()

    def _step_one(self, index: int, action: Any) -> StepResult:
        env = self.envs[index]
        if self._needs_reset[index]:
            obs, info = env.reset()
            return obs, 0.0, False, False, info
        obs, reward, terminated, truncated, info = env.step(action)
        return obs, float(reward), terminated, truncated, info

    def _batch(self, observations: list[Any]) -> Any:
        empty = create_empty_array(self.single_observation_space, self.num_envs)
        assert empty is not None
        return concatenate(self.single_observation_space, observations, empty)


def merge_info(infos: dict[str, Any], info: dict[str, Any], index: int, n: int) -> dict[str, Any]:
    """Gymnasium's vector ``info`` layout (``key`` array + ``_key`` mask), tolerant of mixed types.

    Values that are not all numbers of one kind (a reward that may be None, a
    message that may be missing) become object arrays instead of failing.
    """
    for key, value in info.items():
        if isinstance(value, dict):
            infos[key] = merge_info(infos.get(key, {}), value, index, n)
        else:
            array = infos.get(key)
            if array is None:
                numeric = isinstance(value, bool | int | float | np.number) and not isinstance(value, np.ndarray)
                array = np.zeros(n, dtype=type(value)) if numeric else np.full(n, None, dtype=object)
            try:
                array[index] = value
            except (TypeError, ValueError):
                array = array.astype(object)
                array[index] = value
            infos[key] = array
        mask = infos.get(f"_{key}", np.zeros(n, dtype=bool))
        mask[index] = True
        infos[f"_{key}"] = mask
    return infos


def shell_vector_env(num_envs: int, **kwargs: Any) -> SandboxVectorEnv:
    """The ``vector_entry_point`` of ``snapgym/Shell-v0``."""
    from envs.shell import ShellEnv

    return _vector_of(ShellEnv, num_envs, kwargs)


def python_vector_env(num_envs: int, **kwargs: Any) -> SandboxVectorEnv:
    """The ``vector_entry_point`` of ``snapgym/Python-v0``."""
    from envs.python_env import PythonEnv

    return _vector_of(PythonEnv, num_envs, kwargs)


def _vector_of(env_class: type[SandboxEnv], num_envs: int, kwargs: dict[str, Any]) -> SandboxVectorEnv:
    if num_envs < 1:
        raise ConfigError(f"num_envs must be >= 1, got {num_envs}")
    kwargs.pop("max_episode_steps", None)
    return SandboxVectorEnv([lambda: env_class(**kwargs) for _ in range(num_envs)])
