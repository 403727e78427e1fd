"""Group rollouts: k episodes per task from the same start, played concurrently by a policy, grouped with
GRPO-style advantages; the episodes are the policy's, scored by each task's verifier."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import envs
from pool import ConfigError, LocalBackend
from tests.support.fixtures.envs_fixtures import SOLVE, TASK


def half_right(observation: dict[str, Any], info: dict[str, Any]) -> str:
    """Solves in the even episodes of a group, writes a wrong answer in the odd ones, then submits."""
    if "step" in info:
        return envs.SUBMIT
    return SOLVE if info["rollout_index"] % 2 == 0 else "echo 0 > /app/answer.txt"


def test_a_group_plays_k_episodes_from_one_start_and_its_advantages_rank_them(backend: LocalBackend) -> None:
    env = envs.ShellEnv(backend=backend, tasks=[TASK, "top-ips"])
    try:
        groups = envs.rollout(env, half_right, k=4, tasks=[TASK])
    finally:
        env.close()
    (group,) = groups
    assert group.task_id == TASK and len(group.episodes) == 4
    assert list(group.rewards) == [1.0, 0.0, 1.0, 0.0]
    assert np.allclose(group.advantages(), [1.0, -1.0, 1.0, -1.0], atol=1e-4)
    assert np.allclose(group.advantages(normalize=False), [0.5, -0.5, 0.5, -0.5])
    digests = {episode.infos[0]["start_digest"] for episode in group.episodes}
    assert len(digests) == 1  # one start state for the whole group
    first = group.episodes[0]
    assert first.scored and first.actions == [SOLVE, envs.SUBMIT] and first.rewards == [0.0, 1.0]
    assert len(first.observations) == 3 and first.observations[0]["output"] == envs.load_task(TASK).instruction
    assert first.trajectory["steps"][1]["tool_calls"][0]["arguments"]["command"] == SOLVE


def test_every_task_gets_its_group_and_bad_arguments_are_named(backend: LocalBackend) -> None:
    env = envs.ShellEnv(backend=backend, tasks=[TASK, "top-ips"])
    try:
        groups = envs.rollout(env, lambda obs, info: envs.SUBMIT, k=2)
        assert [g.task_id for g in groups] == sorted([TASK, "top-ips"])
        assert all(list(g.rewards) == [0.0, 0.0] and not g.advantages().any() for g in groups)
        with pytest.raises(ConfigError, match="k >= 1"):
            envs.rollout(env, half_right, k=0)
        with pytest.raises(ConfigError, match="not this environment's"):
            envs.rollout(env, half_right, tasks=["no-such-task"])
    finally:
        env.close()
