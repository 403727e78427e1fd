"""Wrappers for agent loops: an audit trail, a command policy, output that fits a context.

- :class:`RecordTrajectory` appends every reset and step (action, observation,
  reward, timings, verdict) to a JSONL file as it happens.
- :class:`CommandPolicy` refuses actions that match deny patterns or that a
  callback rejects; the agent gets an observation saying why, and the
  refused action still counts as a step.
- :class:`TruncateOutput` keeps the head and tail of long outputs for a model's context.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from envs.base import SandboxEnv
from envs.spaces.trajectory import Trajectory
from pool.errors import ConfigError

Obs = dict[str, Any]


def sandbox_env(env: gym.Env[Any, Any]) -> SandboxEnv:
    """The snapgym environment under Gymnasium's wrappers (``gym.make`` adds some), for its hooks:
    ``sandbox``, ``steps``, ``elapsed_s``, ``checkpoint()``, ``fork()``, ``episode_changes()``,
    ``refuse()``, ``idle()``, ``task_snapshot``, ``state_in_files``.

    Raises:
        ConfigError: there is no snapgym environment under ``env``.
    """
    base = env.unwrapped
    if not isinstance(base, SandboxEnv):
        raise ConfigError(f"{type(base).__name__} is not a snapgym environment")
    return base


class RecordTrajectory(gym.Wrapper[Obs, str, Obs, str]):
    """Append each reset and step to a JSONL file, one JSON object per line.

    Lines are flushed as they are written, so a crash loses at most the line
    being written; with ``fsync=True`` each episode's end is also synced to disk.
    With ``atif_dir``, each finished episode is also written there as
    ``<episode>.json`` in ATIF (:mod:`envs.spaces.trajectory`), the format the runner
    writes into each episode's folder.

    Args:
        env: the environment to record.
        path: the JSONL file (appended to; parent folders are created).
        fsync: sync the file to disk at the end of each episode.
        atif_dir: a folder for each episode's ATIF trajectory (None: none written).
        agent: the agent's name in the ATIF documents.
    """

    def __init__(
        self,
        env: gym.Env[Obs, str],
        path: str | os.PathLike[str],
        *,
        fsync: bool = False,
        atif_dir: str | os.PathLike[str] | None = None,
        agent: str = "unnamed",
    ) -> None:
        super().__init__(env)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._fsync = fsync
        self._episode: str | None = None
        self.atif_dir = Path(atif_dir) if atif_dir is not None else None
        self._agent = agent
        self._trajectory: Trajectory | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Obs, dict[str, Any]]:
        """Reset and record the start: task, snapshot, digest, latency, instruction."""
        obs, info = self.env.reset(seed=seed, options=options)
        self._episode = uuid.uuid4().hex
        self._write({"event": "reset", "seed": seed, "observation": obs["output"], "info": info})
        if self.atif_dir is not None:
            tool = "python" if self._env_id.endswith("Python-v0") else "shell"
            self._trajectory = Trajectory(str(obs["output"]), tool)
        return obs, info

    def step(self, action: str) -> tuple[Obs, float, bool, bool, dict[str, Any]]:
        """Step and record the action, observation, reward, end flags, timings and info."""
        started = time.perf_counter()
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._write(
            {
                "event": "step",
                "action": action,
                "observation": obs["output"],
                "exit_code": obs["exit_code"],
                "reward": reward,
                "terminated": terminated,
                "truncated": truncated,
                "wall_s": time.perf_counter() - started,
                "info": info,
            }
        )
        if (terminated or truncated) and self._fsync:
            os.fsync(self._file.fileno())
        if self._trajectory is not None:
            self._trajectory.add(action, obs, info, None)
            if terminated or truncated:
                self._write_atif(self._trajectory)
                self._trajectory = None
        return obs, float(reward), terminated, truncated, info

    @property
    def _env_id(self) -> str:
        spec = self.env.spec
        return spec.id if spec is not None else type(self.env.unwrapped).__name__

    def _write_atif(self, trajectory: Trajectory) -> None:
        assert self.atif_dir is not None and self._episode is not None
        document = trajectory.as_atif(session_id=self._episode, agent=self._agent, env_id=self._env_id)
        self.atif_dir.mkdir(parents=True, exist_ok=True)
        staged = self.atif_dir / f".{self._episode}.json.tmp"
        staged.write_text(json.dumps(document, indent=1, default=_jsonable, ensure_ascii=False) + "\n")
        os.replace(staged, self.atif_dir / f"{self._episode}.json")

    def close(self) -> None:
        """Close the file and the environment."""
        if not self._file.closed:
            self._file.close()
        super().close()

    def _write(self, record: dict[str, Any]) -> None:
        line = {"time": time.time(), "episode": self._episode, **record}
        self._file.write(json.dumps(line, default=_jsonable, ensure_ascii=False) + "\n")
        self._file.flush()


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return repr(value)


class CommandPolicy(gym.Wrapper[Obs, str, Obs, str]):
    """Refuse actions by pattern or by callback, without running them.

    Args:
        env: a snapgym environment (or a wrapper around one).
        deny: regular expressions; an action matching any (``re.search``) is refused.
        check: called with each action; returns a reason to refuse it, or None to allow.
    """

    def __init__(
        self,
        env: gym.Env[Obs, str],
        *,
        deny: Sequence[str] = (),
        check: Callable[[str], str | None] | None = None,
    ) -> None:
        super().__init__(env)
        if not isinstance(env.unwrapped, SandboxEnv):
            raise ConfigError("CommandPolicy wraps snapgym environments only")
        try:
            self._deny = [re.compile(pattern) for pattern in deny]
        except re.error as exc:
            raise ConfigError(f"invalid deny pattern {exc.pattern!r}: {exc}") from None
        self._check = check

    def step(self, action: str) -> tuple[Obs, float, bool, bool, dict[str, Any]]:
        """Run the action, or count a refused step whose observation gives the reason."""
        base = sandbox_env(self.env)
        base.validate_action(action)
        reason = self.reason(action)
        if reason is None:
            obs, reward, terminated, truncated, info = self.env.step(action)
            return obs, float(reward), terminated, truncated, info
        return base.refuse(reason)

    def reason(self, action: str) -> str | None:
        """Why the policy refuses ``action``, or None when it allows it."""
        for pattern in self._deny:
            if pattern.search(action):
                return f"the command matches the denied pattern {pattern.pattern!r}"
        return self._check(action) if self._check is not None else None


class TruncateOutput(gym.ObservationWrapper[Obs, str, Obs]):
    """Keep the first and last characters of long outputs, marking what was cut.

    Args:
        env: the environment.
        max_chars: the longest ``output`` passed on.
        head_fraction: the share of ``max_chars`` kept from the start (the rest from the end,
            where the exit status line is).
    """

    def __init__(self, env: gym.Env[Obs, str], max_chars: int = 8000, *, head_fraction: float = 0.5) -> None:
        super().__init__(env)
        if max_chars < 64 or not 0.0 <= head_fraction <= 1.0:
            raise ConfigError("TruncateOutput needs max_chars >= 64 and 0 <= head_fraction <= 1")
        self.max_chars = max_chars
        self.head_fraction = head_fraction

    def observation(self, observation: Obs) -> Obs:
        """The observation with ``output`` cut to ``max_chars``."""
        text = observation["output"]
        if len(text) <= self.max_chars:
            return observation
        budget = self.max_chars - 48
        head = int(budget * self.head_fraction)
        tail = budget - head
        omitted = len(text) - head - tail
        cut = f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[len(text) - tail :]}"
        return {**observation, "output": cut}
