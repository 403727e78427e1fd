"""The episode settings of a run: declared once, read by Hydra and by the episode runner.

``benchmarks.schemas.RunConfig`` inherits these fields, so users type them as top-level keys
(``episodes_per_task=4``), and ``benchmarks.episodes.evaluation.EvalSettings`` inherits them too,
adding what the runner derives from the rest of the config (the environment, the concurrency, the
run's name, the verification mode and network chosen). The dataclass is plain (mutable), not
frozen as the style guide asks for values: OmegaConf marks a frozen dataclass read-only, which would
reject every command-line override, and a dataclass cannot inherit from a frozen one.
"""

from __future__ import annotations

from dataclasses import dataclass


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
