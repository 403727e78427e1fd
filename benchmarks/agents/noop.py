"""The agent that does nothing: it submits the start state (a task's floor, which should score 0)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks.agents.base import AgentError, EpisodeContext, Observation
from envs.spaces.actions import SUBMIT


class NoopAgent:
    """Submits at once, after ``steps`` runs of ``true`` (useful to time the episode loop itself)."""

    def __init__(self, *, steps: int = 0) -> None:
        self.name = "noop"
        self.whole_task_steps = False
        self.steps = steps

    def start(self, episode: EpisodeContext) -> _NoopPolicy:
        """A policy that idles ``steps`` times, then submits."""
        return _NoopPolicy(self.steps)

    def resume(self, episode: EpisodeContext, state: Mapping[str, Any]) -> _NoopPolicy:
        """The policy with ``state["left"]`` idle steps to go.

        Raises:
            AgentError: ``left`` is not a count of steps.
        """
        left = state.get("left")
        if not isinstance(left, int) or isinstance(left, bool) or not 0 <= left <= self.steps:
            raise AgentError(f"a noop policy's steps left must be in [0, {self.steps}], got {left!r}")
        return _NoopPolicy(left)


class _NoopPolicy:
    def __init__(self, steps: int) -> None:
        self._left = steps

    def act(self, observation: Observation, info: dict[str, Any]) -> str:
        if self._left <= 0:
            return SUBMIT
        self._left -= 1
        return "true"

    def state(self) -> dict[str, Any]:
        return {"left": self._left}
