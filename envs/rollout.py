"""Group rollouts for RL: k episodes of each task from the same start state, played by a policy,
returned as trajectories grouped per task with GRPO-style advantages.

>>> env = envs.ShellEnv(tasks=["log-error-count", "top-ips"])
>>> groups = envs.rollout(env, lambda obs, info: "submit", k=4)
>>> groups[0].rewards, groups[0].advantages()

Each group's k episodes are children of ``env.fork(k, task_snapshot)``: sandboxes already at the
task's start (leased from the pool when the environment has one), played at once on a thread
each, so the policy is called from k threads (``info["rollout_index"]`` says which episode). An
episode ends when the environment ends it (``submit``, ``max_steps``); an infrastructure failure
leaves it unscored (``scored`` False), and it is left out of its group's advantages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envs.base import SandboxEnv
from envs.spaces.trajectory import Trajectory
from pool.errors import ConfigError

Policy = Callable[[dict[str, Any], dict[str, Any]], str]
"""``policy(observation, info) -> action``; called from several threads at once."""


@dataclass(slots=True)
class Episode:
    """One played episode: what was seen and done, step by step, and how it ended."""

    task_id: str
    observations: list[dict[str, Any]] = field(default_factory=list)
    """The observation after reset, then after each step (one more than ``actions``)."""
    actions: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    """Each step's reward (the verifier's on the last one, 0.0 before)."""
    infos: list[dict[str, Any]] = field(default_factory=list)
    """The reset's info, then each step's."""
    reward: float = 0.0
    """The episode's return (the verifier's reward)."""
    scored: bool = False
    """False when the infrastructure failed, not the agent: leave it out of training."""
    trajectory: dict[str, Any] = field(default_factory=dict)
    """The same episode in ATIF (as the runner writes into each episode's folder)."""


@dataclass(slots=True)
class Group:
    """The k episodes of one task from one start state."""

    task_id: str
    episodes: list[Episode]

    @property
    def rewards(self) -> np.ndarray:
        """Each episode's return (NaN for an unscored one)."""
        return np.array([e.reward if e.scored else np.nan for e in self.episodes], dtype=float)

    def advantages(self, *, normalize: bool = True, eps: float = 1e-6) -> np.ndarray:
        """GRPO's group-relative advantages: each return minus the group's mean (divided by its standard
        deviation when ``normalize``); 0.0 for unscored episodes and for a group whose returns are all equal."""
        rewards = self.rewards
        scored = ~np.isnan(rewards)
        advantages = np.zeros_like(rewards)
        if scored.sum() < 2:
            return advantages
        centred = rewards[scored] - rewards[scored].mean()
        spread = rewards[scored].std()
        advantages[scored] = centred / (spread + eps) if normalize and spread > 0 else centred
        return advantages


def rollout(env: Any, policy: Policy, *, k: int = 4, tasks: Sequence[str] | None = None) -> list[Group]:
    """Play ``k`` episodes of each task (default: every task of ``env``) with ``policy``.

    Args:
        env: a snapgym environment (``gym.make`` result or the environment itself), one task or a set.
        policy: ``policy(observation, info) -> action``.
        k: episodes per task (the group size).
        tasks: task ids of ``env`` to play (default: all of them, in order).

    Raises:
        ConfigError: ``k`` below 1, or a task the environment does not have.
    """
    base: SandboxEnv = env.unwrapped
    chosen = rollout_tasks(base, k, tasks)
    groups = []
    with ThreadPoolExecutor(k, thread_name_prefix="snapgym-rollout") as threads:
        for task_id in chosen:
            base.reset(options={"task": task_id})  # the parent at the task's start: its snapshot is built
            children = base.fork(k, base.task_snapshot)
            try:
                episodes = list(threads.map(lambda pair: _play(pair[1], policy, pair[0]), enumerate(children)))
            finally:
                for child in children:
                    child.close()
            groups.append(Group(task_id, episodes))
    return groups


def rollout_tasks(base: SandboxEnv, k: int, tasks: Sequence[str] | None) -> list[str]:
    """The task ids a rollout plays, checked.

    Raises:
        ConfigError: ``k`` below 1, or a task the environment does not have.
    """
    if k < 1:
        raise ConfigError(f"rollout needs k >= 1, got {k}")
    chosen = list(tasks) if tasks is not None else sorted(base.tasks)
    unknown = [t for t in chosen if t not in base.tasks]
    if unknown:
        raise ConfigError(f"rollout tasks {unknown} are not this environment's: {sorted(base.tasks)}")
    return chosen


class Recorder:
    """One episode being recorded, step by step, as an :class:`Episode` and its ATIF trajectory."""

    def __init__(self, env: SandboxEnv, index: int, obs: dict[str, Any], info: dict[str, Any]) -> None:
        self.env, self.index = env, index
        self.info = {**info, "rollout_index": index}
        """The last info, with ``rollout_index`` (what the policy is shown)."""
        self.episode = Episode(env.task.id, observations=[obs], infos=[self.info])
        kind = "python" if type(env).__name__ == "PythonEnv" else "shell"
        self.trajectory = Trajectory(env.task.instruction, kind)

    def add(self, action: str, step: tuple[dict[str, Any], float, bool, bool, dict[str, Any]]) -> bool:
        """Record one step; True when the episode is over (then ``episode`` is complete)."""
        obs, reward, terminated, truncated, info = step
        self.info = info = {**info, "rollout_index": self.index}
        self.trajectory.add(action, obs, info, None)
        episode = self.episode
        episode.actions.append(action)
        episode.observations.append(obs)
        episode.rewards.append(float(reward))
        episode.infos.append(info)
        if not (terminated or truncated):
            return False
        episode.reward, episode.scored = float(reward), bool(info.get("scored"))
        spec = self.env.spec.id if self.env.spec is not None else type(self.env).__name__
        session = f"{self.env.task.id}:{self.index}"
        episode.trajectory = self.trajectory.as_atif(session_id=session, agent="rollout", env_id=spec)
        return True


def _play(env: SandboxEnv, policy: Policy, index: int) -> Episode:
    recorder = Recorder(env, index, *env.reset())
    while True:
        action = policy(recorder.episode.observations[-1], recorder.info)
        if recorder.add(action, env.step(action)):
            return recorder.episode
