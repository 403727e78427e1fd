"""The asynchronous API: AsyncEnv's steps behave as the environment's own, a step of the local
backend's shell session waits on the event loop (no thread), and the async rollout plays every group
concurrently, never more than ``max_in_flight`` episodes at once, with the thread-based rollout's
results."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

import envs
import envs.aio
from pool import ConfigError, LocalBackend
from tests.support.fixtures.envs_fixtures import SOLVE, TASK

ACTIONS = ["cd /tmp && export SEEN=yes", "pwd; echo $SEEN", "exit 3", "pwd; echo $SEEN >&2", "sleep 5", "true"]


def test_async_steps_see_what_sync_steps_see(backend: LocalBackend) -> None:
    sync_env = envs.ShellEnv(TASK, backend=backend, step_timeout_s=1.0, max_steps=len(ACTIONS))
    sync_env.reset()
    expected = [sync_env.step(action) for action in ACTIONS]
    sync_env.close()

    async def play() -> list[Any]:
        env = envs.aio.AsyncEnv(envs.ShellEnv(TASK, backend=backend, step_timeout_s=1.0, max_steps=len(ACTIONS)))
        try:
            await env.reset()
            return [await env.step(action) for action in ACTIONS]
        finally:
            await env.close()

    got = asyncio.run(play())
    for (obs, reward, term, trunc, info), (obs2, reward2, term2, trunc2, info2) in zip(expected, got, strict=True):
        assert (obs["output"], obs["exit_code"], reward, term, trunc) == (
            obs2["output"], obs2["exit_code"], reward2, term2, trunc2
        )  # fmt: skip
        assert info["step"] == info2["step"] and info.get("timed_out") == info2.get("timed_out")
    assert got[-1][4]["end_reason"] == "max_steps" and got[-1][4]["scored"]  # the verifier ran at the end


def test_a_step_in_the_shell_session_needs_no_thread(backend: LocalBackend) -> None:
    """The executor's only thread is busy for a second; twenty steps finish meanwhile, on the loop."""
    blocking = envs.aio.Blocking(threads=1)

    async def play() -> tuple[int, bool]:
        env = envs.aio.AsyncEnv(envs.ShellEnv(TASK, backend=backend), blocking=blocking)
        await env.reset()
        busy = asyncio.ensure_future(blocking.run(time.sleep, 1.0))
        await asyncio.sleep(0.05)
        done = 0
        for n in range(20):
            obs, *_ = await env.step(f"echo {n}")
            done += obs["output"].startswith(f"{n}\n")
        still_busy = not busy.done()
        await busy
        await env.close()
        return done, still_busy

    try:
        assert asyncio.run(play()) == (20, True)
    finally:
        blocking.close()


def half_right_async(active: set[tuple[str, int]], most: list[int]) -> envs.aio.AsyncPolicy:
    async def policy(observation: dict[str, Any], info: dict[str, Any]) -> str:
        key = (TASK, info["rollout_index"])  # one task is played
        await asyncio.sleep(0.01)  # a model call
        if "step" in info:
            active.discard(key)
            return envs.SUBMIT
        active.add(key)
        most[0] = max(most[0], len(active))
        return SOLVE if info["rollout_index"] % 2 == 0 else "echo 0 > /app/answer.txt"

    return policy


def test_async_rollout_groups_and_scores_like_the_thread_rollout_within_its_bound(backend: LocalBackend) -> None:
    env = envs.ShellEnv(backend=backend, tasks=[TASK, "top-ips"])
    active: set[tuple[str, int]] = set()
    most = [0]
    threads_before = threading.active_count()
    try:
        groups = asyncio.run(envs.aio.rollout(env, half_right_async(active, most), k=4, tasks=[TASK], max_in_flight=3))
    finally:
        env.close()
    (group,) = groups
    assert group.task_id == TASK and list(group.rewards) == [1.0, 0.0, 1.0, 0.0]
    assert np.allclose(group.advantages(), [1.0, -1.0, 1.0, -1.0], atol=1e-4)
    assert 1 <= most[0] <= 3
    first = group.episodes[0]
    assert first.actions == [SOLVE, envs.SUBMIT] and first.rewards == [0.0, 1.0] and first.scored
    assert first.trajectory["steps"][1]["tool_calls"][0]["arguments"]["command"] == SOLVE
    assert threading.active_count() <= threads_before + envs.aio.blocking.DEFAULT_THREADS


def test_async_rollout_refuses_bad_bounds(backend: LocalBackend) -> None:
    env = envs.ShellEnv(TASK, backend=backend)
    try:
        with pytest.raises(ConfigError, match="max_in_flight must be at least 1"):
            asyncio.run(envs.aio.rollout(env, lambda obs, info: "submit", max_in_flight=0))
        with pytest.raises(ConfigError, match="k >= 1"):
            asyncio.run(envs.aio.rollout(env, lambda obs, info: "submit", k=0))
    finally:
        env.close()


def test_a_wrapped_env_and_python_env_step_on_the_executor_with_their_own_semantics(backend: LocalBackend) -> None:
    """No asynchronous path (a Gymnasium wrapper's synchronous step, Python-v0's interpreter): each
    step runs whole on the executor, and behaves as the environment's own."""
    import gymnasium as gym

    async def play() -> tuple[str, str]:
        wrapped = envs.aio.AsyncEnv(gym.make("snapgym/Shell-v0", task=TASK, backend=backend))
        python = envs.aio.AsyncEnv(envs.PythonEnv(TASK, backend=backend))
        try:
            await wrapped.reset()
            await python.reset()
            await python.step("x = 6 * 7")
            shell_obs, *_ = await wrapped.step("echo wrapped")
            python_obs, *_ = await python.step("print(x)")
            with pytest.raises(envs.InvalidActionError):
                await wrapped.step(b"not text")  # type: ignore[arg-type]
            return shell_obs["output"], python_obs["output"]
        finally:
            await wrapped.close()
            await python.close()

    shell_output, python_output = asyncio.run(play())
    assert shell_output.startswith("wrapped\n") and python_output.startswith("42")
