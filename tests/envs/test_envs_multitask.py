"""One environment over a task set: reset() picks the task (asked for, or sampled with the seeded
generator or a sampler hook), each task starts from its own snapshot and is verified by its own tests."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import pytest

import envs
from pool import ConfigError, LocalBackend
from tests.support.fixtures.envs_fixtures import SOLVE, TASK

OTHER = "top-ips"


def test_reset_picks_the_asked_task_and_its_own_start_state_and_verifier(backend: LocalBackend) -> None:
    env = envs.ShellEnv(backend=backend, tasks=[TASK, OTHER])
    try:
        assert set(env.tasks) == {TASK, OTHER}
        obs, info = env.reset(options={"task": OTHER})
        assert info["task_id"] == OTHER and obs["output"] == envs.load_task(OTHER).instruction
        other_digest = info["start_digest"]
        assert "access.log" in env.step("ls /app")[0]["output"]
        _, reward, terminated, *_ = env.step(envs.SUBMIT)
        assert terminated and reward == 0.0
        _, info = env.reset(options={"task": TASK})
        assert info["task_id"] == TASK and info["start_digest"] != other_digest
        env.step(SOLVE)
        assert env.step(envs.SUBMIT)[1] == 1.0  # TASK's own tests
        _, again = env.reset(options={"task": OTHER})
        assert again["start_digest"] == other_digest  # each task, its own identical start
        with pytest.raises(ConfigError, match="not one of this environment's tasks"):
            env.reset(options={"task": "no-such-task"})
    finally:
        env.close()


def test_sampling_is_seeded_and_a_sampler_hook_decides(backend: LocalBackend) -> None:
    def sampled(seed: int) -> list[str]:
        env = envs.ShellEnv(backend=backend, tasks=[TASK, OTHER])
        try:
            picks = [env.reset(seed=seed)[1]["task_id"]]
            picks += [env.reset()[1]["task_id"] for _ in range(7)]
            return picks
        finally:
            env.close()

    first = sampled(3)
    assert first == sampled(3) and set(first) == {TASK, OTHER}  # same seed, same tasks; both drawn

    calls: list[Sequence[str]] = []

    def always_other(rng: np.random.Generator, ids: Sequence[str]) -> str:
        calls.append(ids)
        return OTHER

    env = gym.make("snapgym/Shell-v0", backend=backend, tasks=[TASK, OTHER], task_sampler=always_other)
    try:
        assert [env.reset()[1]["task_id"] for _ in range(3)] == [OTHER] * 3
        assert calls[0] == sorted([TASK, OTHER])
    finally:
        env.close()


def test_a_vector_environment_samples_a_task_per_sub_environment(backend: LocalBackend) -> None:
    vec = gym.make_vec("snapgym/Shell-v0", num_envs=4, backend=backend, tasks=[TASK, OTHER])
    try:
        _, info = vec.reset(seed=0)
        assert set(info["task_id"]) <= {TASK, OTHER}
    finally:
        vec.close()


def test_an_empty_or_repeated_task_set_is_refused(backend: LocalBackend) -> None:
    with pytest.raises(ConfigError, match="at least one"):
        envs.ShellEnv(backend=backend, tasks=[])
    with pytest.raises(ConfigError, match="twice"):
        envs.ShellEnv(backend=backend, tasks=[TASK, TASK])
