"""An environment's ``reset``/``step``/``close`` as coroutines: many episodes on one event loop.

A step of ``snapgym/Shell-v0`` on the local backend is written to the sandbox's persistent shell
and its output read when the event loop's selector says the pipes are ready
(``LocalSandbox.shell_async``): waiting for it holds no thread. The blocking parts (reset, the
verifier at the end, close, pause; a step on another backend or through a wrapper) run on a small
shared executor (:mod:`envs.aio.blocking`), whose threads do not grow with the episodes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from envs.aio.blocking import Blocking, shared
from envs.base import SandboxEnv
from envs.episode.pause import PausedEpisode
from envs.episode.state import check_running
from envs.spaces.actions import SUBMIT
from envs.spaces.observations import exec_info, observe
from pool.errors import SandboxError
from pool.results import ExecResult

StepResult = tuple[dict[str, Any], float, bool, bool, dict[str, Any]]


class AsyncEnv:
    """A snapgym environment (``gym.make`` result or the environment itself) driven with ``await``.

    Args:
        env: the environment; a wrapped one runs each step whole on the executor (the wrapper's
            ``step`` is synchronous).
        blocking: the executor for the blocking parts (default: the process's shared one).
    """

    def __init__(self, env: Any, *, blocking: Blocking | None = None) -> None:
        self.env = env
        """The environment as given."""
        self.unwrapped: SandboxEnv = env.unwrapped
        self._blocking = blocking or shared()
        run_async = getattr(self.unwrapped, "_run_async", None) if env is self.unwrapped else None
        self._run_async = cast("Callable[[str], Awaitable[ExecResult | None]] | None", run_async)

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``env.reset()``, on the executor."""
        result: tuple[dict[str, Any], dict[str, Any]] = await self._blocking.run(
            self.env.reset, seed=seed, options=options
        )
        return result

    async def step(self, action: str) -> StepResult:
        """``env.step(action)``; a command's wait is the event loop's where the sandbox allows it."""
        base = self.unwrapped
        if self._run_async is None or not isinstance(action, str) or action.strip() == SUBMIT:
            return cast(StepResult, await self._blocking.run(self.env.step, action))
        check_running(base.state)
        base.validate_action(action)
        try:
            result = await self._run_async(action)
        except SandboxError as exc:
            return await self._blocking.run(base._step_failed, exc)
        if result is None:  # no asynchronous path for this sandbox
            return cast(StepResult, await self._blocking.run(self.env.step, action))
        obs, info = observe(result), {**exec_info(result)}
        if base.end_reason(base.steps + 1) is not None:  # this step ends the episode: the verifier runs
            return await self._blocking.run(base._after_command, obs, info)
        return base._after_command(obs, info)

    async def pause(self, *, carry: Mapping[str, Any] | None = None) -> PausedEpisode:
        """``env.pause()`` (a checkpoint), on the executor."""
        return await self._blocking.run(self.unwrapped.pause, carry=carry)

    async def resume(self, handle: PausedEpisode | Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``env.resume(handle)``, on the executor."""
        return await self._blocking.run(self.unwrapped.resume, handle)

    async def close(self) -> None:
        """``env.close()``, on the executor."""
        await self._blocking.run(self.env.close)
