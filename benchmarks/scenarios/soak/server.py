"""One backend serving the soak's episodes: an environment per worker thread, all on that backend."""

from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym

from benchmarks.scenarios.cost.segments import SegmentCost
from benchmarks.scenarios.soak.windows import Timings, play_chunk, play_episode
from benchmarks.scenarios.throughput import TRIVIAL_TASK, episode_actions
from pool import Backend


class Server:
    """``size`` environments of the trivial task on ``backend`` and as many worker threads; close it.

    Args:
        backend: serves every episode (its daemon lives as long as the backend).
        size: episodes at a time.
        steps: steps per episode, as throughput's.
    """

    def __init__(self, backend: Backend, size: int, steps: int) -> None:
        self._actions = episode_actions(steps)
        self._environments: list[gym.Env[Any, Any]] = []
        self._pool: queue.Queue[gym.Env[Any, Any]] = queue.Queue()
        self._workers = ThreadPoolExecutor(max_workers=size, thread_name_prefix="snapgym-soak")
        try:
            for _ in range(size):
                env = gym.make("snapgym/Shell-v0", task=str(TRIVIAL_TASK), backend=backend, max_steps=steps + 1)
                self._environments.append(env)
                self._pool.put(env)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def warm(self, episodes: int) -> None:
        """Play ``episodes`` episodes round the environments, unmeasured (the snapshot built, the spares made)."""
        for index in range(episodes):
            play_episode(self._environments[index % len(self._environments)], self._actions)

    def chunk(self, episodes: int) -> tuple[SegmentCost, Timings]:
        """Play ``episodes`` episodes, all environments at once; their cost and timings."""
        return play_chunk(episodes, self._workers, self._pool, self._actions)

    def close(self) -> None:
        """Stop the workers and close the environments (their sandboxes)."""
        self._workers.shutdown()
        for env in self._environments:
            env.close()
