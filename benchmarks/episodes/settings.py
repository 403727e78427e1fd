"""The episode settings of a run: declared once, read by Hydra and by the episode runner.

``benchmarks.schemas.RunConfig`` inherits these fields, so users type them as top-level keys
(``episodes_per_task=4``), and ``EvalSettings`` (below) inherits them too, adding what the runner
derives from the rest of the config (the environment, the concurrency and processes, the run's
name, the verification mode and network chosen). The dataclasses are plain (mutable), not
frozen as the style guide asks for values: OmegaConf marks a frozen dataclass read-only, which would
reject every command-line override, and a dataclass cannot inherit from a frozen one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pool.errors import ConfigError


@dataclass
class EpisodeSettings:
    """How each episode of a run is played, retried and scored."""

    episodes_per_task: int = 1
    """k: episodes per task, all from the task's snapshot (a group, for pass@k)."""
    seed: int = 0
    """Episode i of a task gets seed ``seed + i``."""
    max_steps: int = 50
    """Steps per episode before it is truncated (the verifier still scores it)."""
    step_timeout_s: float = 120.0
    """Timeout of one action (the oracle's one action gets the task's agent timeout)."""
    max_action_bytes: int = 65536
    """The largest action accepted (UTF-8 bytes); a larger one raises InvalidActionError without reaching
    the sandbox."""
    episode_timeout_s: float | None = None
    """Wall-clock budget of one episode, agent included (a monotonic clock); past it the episode ends as
    ``timeout``."""
    max_attempts: int = 3
    """Attempts of an episode whose infrastructure failed, before it ends as ``infra_error``
    (attempts that fail during an outage do not count)."""
    outage_timeout_s: float = 600.0
    """How long the run waits out an outage (the sandbox pool, backend or model endpoint cannot serve
    at all) before the circuit breaker stops it: non-zero exit, summary.json written, resumable."""
    outage_backoff_max_s: float = 30.0
    """During an outage, health probes start at once and back off (doubling from 0.5 s) up to this."""
    checkpoint_every: int = 0
    """Journal a checkpoint of each episode every this many steps (the sandbox's files, the agent's declared
    state), so that a resumed run goes on from the last one instead of playing the episode again; 0: off.
    Resumable: the replay, llm and noop agents on Shell-v0 (see benchmarks.episodes.recording.durable)."""
    success_threshold: float = 1.0
    """A reward at or above this is a pass."""
    calibrate: bool = True
    """Before the agent plays a task whose verifier may use the network, show that its reference
    solution scores 1.0 and doing nothing 0.0 in this run's environment (cached); a task that does
    not is skipped, saying why (see benchmarks.episodes.calibration)."""
    calibrate_verification: bool = True
    """Let the calibration choose a task's verification mode: when the run leaves the mode to the task
    (``verification=task``, the default), the task's is strict, its reference solution scores below 1.0
    there and the backend offers shared, it is calibrated again in shared mode and played in shared mode
    if that holds (recorded in the ledger and summary). False: such a task is skipped, the reason naming
    the mode."""


@dataclass
class EvalSettings(EpisodeSettings):
    """What the runner needs from the config: the episode settings, and what it derives from the rest.

    Plain (mutable) because it inherits the one declaration of the episode settings, which Hydra's
    ``RunConfig`` inherits too (see above); the runner never changes it.
    """

    env_id: str = "snapgym/Shell-v0"
    """The environment every episode runs in."""
    concurrency: int = 4
    """Episodes played at once (threads; ``pool.size``), over all the runner's processes."""
    processes: int = 1
    """Runner processes playing the episodes (``processes``): 1 plays them all in this one; more spread them
    over worker processes that share the run's ledger (see ``benchmarks.episodes.procs``)."""
    run_id: str = ""
    """The run's name (its folder's); every sandbox the run makes carries it as ``snapgym.run``."""
    verification: str | None = None
    """"strict", "toolchain" or "shared" for every episode; None: each task's own mode."""
    network: Any = None
    """The network of every episode (see envs.episode.network); None: each task's own policy per phase."""
    verification_chosen_by: dict[str, str] = field(default_factory=dict)
    """Why the calibration chose a task's verification mode, by task id (copied into its results)."""
    verification_chosen: dict[str, str] = field(default_factory=dict)
    """The mode the calibration chose, by task id ("toolchain" or "shared")."""

    def __post_init__(self) -> None:
        """Refuse values no episode could run with, before any work starts (naming the key)."""
        at_least_one = (
            "episodes_per_task",
            "concurrency",
            "processes",
            "max_steps",
            "max_action_bytes",
            "max_attempts",
        )
        positive = ("step_timeout_s", "outage_timeout_s", "outage_backoff_max_s")
        wrong = [f"{name}={getattr(self, name)} (at least 1)" for name in at_least_one if getattr(self, name) < 1]
        wrong += [f"{name}={getattr(self, name)} (above 0)" for name in positive if not getattr(self, name) > 0]
        if self.checkpoint_every < 0:
            wrong.append(f"checkpoint_every={self.checkpoint_every} (0 for none, or a number of steps)")
        if self.episode_timeout_s is not None and not self.episode_timeout_s > 0:
            wrong.append(f"episode_timeout_s={self.episode_timeout_s} (above 0, or null for none)")
        if self.processes > self.concurrency:
            wrong.append(
                f"processes={self.processes} (at most pool.size={self.concurrency}: each plays an episode at a time)"
            )
        if wrong:
            keys = {"concurrency": "pool.size"}
            named = [keys.get(item.split("=")[0], item.split("=")[0]) + "=" + item.split("=", 1)[1] for item in wrong]
            raise ConfigError(f"invalid run settings: {', '.join(named)}")
