"""What an agent is to the runner: something that, per episode, turns observations into actions.

The agent loop runs in the runner's process, outside the sandbox (the
"sandbox as a tool" pattern): model keys, prompts and the ledger never enter
a sandbox; only the actions do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym

from envs.tasks import Task
from pool.errors import SnapgymError

Observation = dict[str, Any]


class AgentError(SnapgymError):
    """The agent failed (a bug, an unusable reply): the episode ends as ``agent_error``, not retried."""


class ModelUnavailableError(SnapgymError):
    """The model endpoint could not be reached or kept failing: an infrastructure failure, retried."""


class ModelRequestError(SnapgymError):
    """The model endpoint refused the request itself (bad key, unknown model): the run stops, resumable."""


@dataclass(frozen=True, slots=True)
class EpisodeContext:
    """What an agent may know about the episode it is about to play."""

    task: Task
    """The task (its instruction is also the first observation)."""
    env: gym.Env[Observation, str]
    """The environment; ``envs.sandbox_env(env).sandbox`` is the sandbox (the oracle copies its solution in)."""
    env_id: str
    """``snapgym/Shell-v0`` or ``snapgym/Python-v0``: what an action means."""
    seed: int
    """The episode's seed (also passed to ``env.reset``)."""


class Policy(Protocol):
    """One episode's decision maker."""

    def act(self, observation: Observation, info: dict[str, Any]) -> str:
        """The next action, given the last observation and info (``envs.SUBMIT`` ends the episode).

        A policy may also keep ``last_turn``, a dict with its last ``message``, ``model_name``,
        ``prompt_tokens`` and ``completion_tokens``; the runner writes it into the trajectory."""


class Agent(Protocol):
    """A factory of per-episode policies; shared by the runner's threads, so it keeps no episode state."""

    name: str
    """Recorded in the ledger as the episode's ``agent``."""
    whole_task_steps: bool
    """True for an agent whose one action does the whole task (the oracle runs ``solve.sh``):
    its steps get the task's agent timeout instead of the run's ``step_timeout_s``."""

    def start(self, episode: EpisodeContext) -> Policy:
        """A policy for one episode, called after ``env.reset``."""


class SavablePolicy(Policy, Protocol):
    """A policy whose state can be written down at a checkpoint (see :class:`ResumableAgent`)."""

    def state(self) -> dict[str, Any]:
        """What the policy needs to go on from here, as JSON-ready values (a chat agent's messages,
        a replay's position)."""


@runtime_checkable
class ResumableAgent(Protocol):
    """An agent whose episodes survive a crash of the runner: with ``checkpoint_every`` set, the runner
    journals each policy's :meth:`SavablePolicy.state` beside a checkpoint of the sandbox, and a resumed
    run goes on from there. Agents that are not resumable play an interrupted episode again from its start."""

    def start(self, episode: EpisodeContext) -> SavablePolicy:
        """A policy for one episode, called after ``env.reset``."""

    def resume(self, episode: EpisodeContext, state: Mapping[str, Any]) -> SavablePolicy:
        """The policy that ``state`` (from :meth:`SavablePolicy.state`) was written by, called after
        ``env.reset`` put the sandbox at the checkpoint.

        Raises:
            AgentError: ``state`` is not one this agent wrote (the episode is then played from its start).
        """


@runtime_checkable
class CutsCalls(Protocol):
    """An agent whose model requests a stopping run can cut (the llm agent): Ctrl-C, an outage's breaker or
    an endpoint that never answered then ends its episodes in flight at once, not after a request's timeout."""

    def cut_calls(self) -> None:
        """Make the requests in flight fail now and new ones fail at once, until :meth:`allow_calls`."""

    def allow_calls(self) -> None:
        """Let requests through (called as a run begins)."""
