"""Durable episodes: checkpoints every k steps, and a resumed run that goes on from the last one.

An agent outside the sandbox may play for hours; a runner killed at step 300
should not throw 300 steps away. With ``checkpoint_every=k``, after every k-th
step the runner takes a checkpoint of the sandbox (``env.checkpoint()``: its
files, with the shell's working directory and exported variables, which
Shell-v0 keeps in a file) and writes it to the episode's journal
(:mod:`benchmarks.episodes.recording.journal`) with the agent's declared state
(``SavablePolicy.state()``), the step count, the clocks and the changes so far.

When the runner is killed (or the sandbox fails) mid-episode, the next attempt
of the episode starts from the sandbox restored to the last checkpoint, with the
agent rebuilt from its state (``ResumableAgent.resume``), the step count and the
task's agent clock where they were (a resumed episode gets no extra steps or
time), and the trajectory up to the checkpoint read back. The restored
sandbox's start digest must equal the checkpoint's digest. The result says
``resumed_from_step: k`` and ``steps_replayed: 0``, and keeps the provenance of
the episode's real start (the task's snapshot and its digest).

What a checkpoint does not keep: processes the agent left running, a Python
env's variables (Python-v0 episodes are never resumed), unexported shell
variables and functions. An agent that is not resumable, a checkpoint that is
gone from the backend's store, or a state the agent refuses all fall back to a
replay from the start, as without checkpoints, and the result says how many
journalled steps were played again (``steps_replayed``).

The time a checkpoint takes is not charged to the agent (the environment's clock
skips it); it is in the result as ``checkpoint_s``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, fields
from typing import Any

import gymnasium as gym

from benchmarks.agents.base import Agent, AgentError, EpisodeContext, ResumableAgent, SavablePolicy
from benchmarks.episodes.recording.journal import Checkpoint, EpisodeJournal, JournalState
from envs.spaces.observations import make_observation
from envs.spaces.trajectory import Trajectory
from envs.wrappers import sandbox_env
from pool.errors import SnapgymError
from pool.snapshots import Snapshot

log = logging.getLogger(__name__)

PROVENANCE = ("snapshot_id", "start_digest", "sandbox_id", "provider", "verification", "reset_latency_ms",
              "reset_kind")  # fmt: skip
"""The result fields that say where an episode started (a resumed attempt keeps the first start's)."""
_NOT_COUNTS = ("instruction", "tool", "steps")
Seen = tuple[dict[str, Any], dict[str, Any]]
"""A step's observation and info."""


@dataclass(frozen=True, slots=True)
class Durability:
    """How one attempt of an episode is journalled (``every`` > 0) and whether it may go on from a checkpoint."""

    journal: EpisodeJournal
    attempt: int
    every: int
    earlier: JournalState
    """What the journal held before this attempt began."""


@dataclass(slots=True)
class Resumed:
    """An attempt that goes on from a checkpoint: its first observation, info and policy."""

    observation: dict[str, Any]
    info: dict[str, Any]
    policy: SavablePolicy
    trajectory: Trajectory


class DurableAttempt:
    """Journals one attempt and takes its checkpoints.

    Args:
        durability: the journal and the policy of checkpoints.
        env: the attempt's environment.
        agent: the attempt's agent.
    """

    def __init__(self, durability: Durability, env: gym.Env[Any, str], agent: Agent) -> None:
        self.durability = durability
        self.env = env
        self.agent = agent
        self.checkpoints = 0
        self.checkpoint_s = 0.0
        self.can_checkpoint = isinstance(agent, ResumableAgent) and sandbox_env(env).state_in_files
        """Whether a checkpoint of this attempt could be resumed from (else only steps are journalled)."""

    @property
    def checkpoint_to_resume(self) -> Checkpoint | None:
        """The checkpoint this attempt should start from, if any."""
        earlier = self.durability.earlier
        return earlier.checkpoint if self.can_checkpoint and earlier.can_go_on else None

    def resume(self, context: EpisodeContext, instruction: str, tool: str) -> Resumed:
        """Put the sandbox at the last checkpoint and rebuild the agent's policy there.

        Raises:
            SnapgymError: the checkpoint could not be restored, or its digest did not match.
            AgentError: the agent refused its saved state.
        """
        checkpoint = self.checkpoint_to_resume
        assert checkpoint is not None and isinstance(self.agent, ResumableAgent)
        snapshot = Snapshot.from_dict(checkpoint.snapshot)
        resume_at = {"step": checkpoint.step, "elapsed_s": checkpoint.elapsed_s, "changes": checkpoint.changes}
        obs, info = self.env.reset(seed=context.seed, options={"snapshot": snapshot, "resume_at": resume_at})
        if info.get("start_digest") != snapshot.digest:
            raise SnapgymError(
                f"the restored checkpoint's digest {info.get('start_digest')} is not the journalled {snapshot.digest}"
            )
        policy = self.agent.resume(context, checkpoint.agent_state)
        obs = make_observation(checkpoint.observation["output"], checkpoint.observation["exit_code"])
        info = {**checkpoint.info, **info}  # what the agent saw at the checkpoint, and where this attempt began
        trajectory = Trajectory(instruction, tool, steps=list(self.durability.earlier.steps), **checkpoint.trajectory)
        self.durability.journal.resumed(self.durability.attempt, checkpoint)
        return Resumed(obs, info, policy, trajectory)

    def started(self, provenance: dict[str, Any]) -> None:
        """The attempt began at the task's snapshot."""
        self.durability.journal.start(self.durability.attempt, provenance)

    def ended(self, outcome: str) -> None:
        """The attempt ended."""
        self.durability.journal.end(self.durability.attempt, outcome)

    def after_step(self, policy: Any, trajectory: Trajectory, seen: Seen, timings: dict[str, float]) -> None:
        """Journal the step just played; every ``every`` steps, take and journal a checkpoint.

        ``seen``: the step's observation and info; ``timings``: the runner's ``episode_s``, ``agent_s`` and
        ``env_s`` so far.
        """
        base = sandbox_env(self.env)
        step = base.steps
        entry = trajectory.steps[-1] if trajectory.total_steps == len(trajectory.steps) else None
        self.durability.journal.step(self.durability.attempt, step, entry)
        if not self.can_checkpoint or step % self.durability.every:
            return
        clock = time.perf_counter()
        try:
            snapshot = base.checkpoint()
            changes = base.episode_changes()
            state = policy.state()
            checkpoint = Checkpoint(
                attempt=self.durability.attempt, step=step, snapshot=snapshot.to_dict(), agent_state=state,
                elapsed_s=base.elapsed_s, changes=changes, trajectory=trajectory_counts(trajectory),
                observation={"output": str(seen[0]["output"]), "exit_code": int(seen[0]["exit_code"])},
                info=json.loads(json.dumps(seen[1], default=str)), **timings,
            )  # fmt: skip
            self.durability.journal.checkpoint(checkpoint)
            self.checkpoints += 1
        except (SnapgymError, AgentError, TypeError, ValueError) as exc:  # the episode goes on without it
            log.warning("checkpoint at step %d failed: %s: %s", step, type(exc).__name__, exc)
            self.durability.journal.checkpoint_failed(self.durability.attempt, step, f"{type(exc).__name__}: {exc}")
        finally:
            self.checkpoint_s += time.perf_counter() - clock


def trajectory_counts(trajectory: Trajectory) -> dict[str, Any]:
    """A trajectory's fields but its instruction, tool and steps (the journal has the steps)."""
    return {f.name: getattr(trajectory, f.name) for f in fields(trajectory) if f.name not in _NOT_COUNTS}
