"""``envs.rollout`` on one event loop: every episode of every group in flight at once, up to a bound.

>>> groups = asyncio.run(envs.aio.rollout(env, policy, k=8, max_in_flight=64))

The policy may be a coroutine function (``async def policy(obs, info) -> str``, e.g. a call to an
inference server) or a plain one (called on the loop: keep it quick). Each episode's sandbox is
forked from its task's snapshot when its turn comes (the episodes whose turn came meanwhile share
one fork call), so no more than ``max_in_flight`` sandboxes are held at once; on a pool the bound
is at most the pool's ``max_size``. Episodes come back grouped per task, in order, as
:class:`envs.rollout.Group` (GRPO advantages included).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from envs.aio.blocking import Blocking, shared
from envs.aio.env import AsyncEnv
from envs.base import SandboxEnv
from envs.episode.sources import PoolSource
from envs.rollout import Episode, Group, Recorder, rollout_tasks
from pool.errors import ConfigError

AsyncPolicy = Callable[[dict[str, Any], dict[str, Any]], "str | Awaitable[str]"]
"""``policy(observation, info) -> action``, or a coroutine function returning the action."""


async def rollout(
    env: Any,
    policy: AsyncPolicy,
    *,
    k: int = 4,
    tasks: Sequence[str] | None = None,
    max_in_flight: int | None = None,
    blocking: Blocking | None = None,
) -> list[Group]:
    """Play ``k`` episodes of each task (default: every task of ``env``) concurrently on this loop.

    Args:
        env: a snapgym environment (``gym.make`` result or the environment itself), one task or a set.
        policy: ``policy(observation, info) -> action``, plain or ``async``.
        k: episodes per task (the group size).
        tasks: task ids of ``env`` to play (default: all of them, in order).
        max_in_flight: episodes (and sandboxes) at once, over all groups (default: all of them; on a
            pool, at most its ``max_size``).
        blocking: the executor for resets, verifiers and closes (default: the shared one).

    Raises:
        ConfigError: ``k`` or ``max_in_flight`` below 1, or a task the environment does not have.
    """
    base: SandboxEnv = env.unwrapped
    chosen = rollout_tasks(base, k, tasks)
    bound = in_flight_bound(base, max_in_flight, len(chosen) * k)
    blocking = blocking or shared()
    parents: list[SandboxEnv] = []  # one per task, whose children are that task's episodes
    try:
        for task_id in chosen:  # the parent at each task's start: its snapshot is built
            await blocking.run(base.reset, options={"task": task_id})
            parents.extend(await blocking.run(base.fork, 1, base.task_snapshot))
        slots = asyncio.Semaphore(bound)
        supplies = [_Children(parent, blocking) for parent in parents]
        plays = [[_play(supply, policy, index, slots) for index in range(k)] for supply in supplies]
        played = await asyncio.gather(*(asyncio.gather(*group) for group in plays))
    finally:
        for parent in parents:
            await blocking.run(parent.close)
    return [Group(task_id, list(episodes)) for task_id, episodes in zip(chosen, played, strict=True)]


def in_flight_bound(base: SandboxEnv, asked: int | None, episodes: int) -> int:
    """How many episodes may be in flight: ``asked`` (default: all), at most a pool's ``max_size``."""
    if asked is not None and asked < 1:
        raise ConfigError(f"max_in_flight must be at least 1, got {asked}")
    bound = min(asked or episodes, episodes)
    source = base.source
    if isinstance(source, PoolSource):
        size = getattr(getattr(source.pool, "config", None), "max_size", None)
        if isinstance(size, int) and size > 0:
            bound = min(bound, size)
    return bound


class _Children:
    """A task's episodes' sandboxes, forked in batches: every episode that got its slot while a fork
    was under way is served by the next fork, one backend call for all of them (as ``envs.rollout``
    forks its k at once), and never more than the slots taken."""

    def __init__(self, parent: SandboxEnv, blocking: Blocking) -> None:
        self.parent, self.blocking = parent, blocking
        self._waiting: list[asyncio.Future[SandboxEnv]] = []
        self._forking: asyncio.Task[None] | None = None

    async def take(self) -> SandboxEnv:
        """A child at the task's start (for an episode that holds a slot)."""
        wanted: asyncio.Future[SandboxEnv] = asyncio.get_running_loop().create_future()
        self._waiting.append(wanted)
        if self._forking is None:
            self._forking = asyncio.ensure_future(self._fork())
        return await wanted

    async def _fork(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    children = await self.blocking.run(self.parent.fork, len(batch), self.parent.task_snapshot)
                except Exception as exc:
                    for wanted in batch:
                        wanted.set_exception(exc)
                    continue
                for wanted, child in zip(batch, children, strict=True):
                    wanted.set_result(child)
        finally:
            self._forking = None


async def _play(supply: _Children, policy: AsyncPolicy, index: int, slots: asyncio.Semaphore) -> Episode:
    async with slots:
        child = await supply.take()
        env = AsyncEnv(child, blocking=supply.blocking)
        try:
            recorder = Recorder(child, index, *await env.reset())
            while True:
                action = policy(recorder.episode.observations[-1], recorder.info)
                if inspect.isawaitable(action):
                    action = await action
                if recorder.add(action, await env.step(action)):
                    return recorder.episode
        finally:
            await env.close()
