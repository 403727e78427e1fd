"""One attempt of one episode: reset, let the agent act until the episode ends, classify the end.

The outcome classes, as recorded in the ledger:

- ``scored``: the verifier scored the end state (``reward``); ``end_reason``
  says whether the agent submitted, ran out of steps, or hit the task's time limit.
- ``agent_error``: the agent raised or gave an unusable reply. Counts as a
  failed episode (reward 0 in means), not retried.
- ``timeout``: the episode outran ``episode_timeout_s`` (agent included).
  Counts as a failed episode, not retried.
- ``infra_error``: the sandbox, backend, pool, verifier or model endpoint
  failed (for an agent inside the sandbox: its last model call found the
  endpoint unreachable or overloaded, and the episode scored 0). Retried
  under a new attempt id; never averaged in as a reward; not final: a
  resumed run supersedes it and plays the episode again.
- ``network_denied`` / ``network_unreachable``: the verification failed
  because the verifier could not download what it needed (its policy refused
  the host, or the host could not be reached; see ``envs.episode.network``). Not
  retried (it would fail again), never averaged in as a reward; the summary
  lists the tasks and the setting that would let them run. A ``scored`` 0.0
  whose verifier had other connections fail keeps its score and carries
  ``network_suspect`` (the connections), which the summary counts per task.

An action the environment refuses (too large, a NUL, not text) does not end
the episode: it counts as a step and the agent is told why.
"""

from __future__ import annotations

import functools
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from benchmarks.agents.base import Agent, AgentError, EpisodeContext, ModelRequestError, ModelUnavailableError
from benchmarks.episodes.recording.durable import PROVENANCE, Durability, DurableAttempt, Resumed
from envs.errors import InvalidActionError
from envs.spaces.trajectory import Trajectory
from envs.tasks import Task
from envs.wrappers import sandbox_env
from pool.errors import SnapgymError

SCORED = "scored"
AGENT_ERROR = "agent_error"
TIMEOUT = "timeout"
INFRA_ERROR = "infra_error"
NETWORK_DENIED = "network_denied"
NETWORK_UNREACHABLE = "network_unreachable"
OUTCOMES = (SCORED, AGENT_ERROR, TIMEOUT, INFRA_ERROR, NETWORK_DENIED, NETWORK_UNREACHABLE)
UNSCORED = (INFRA_ERROR, NETWORK_DENIED, NETWORK_UNREACHABLE)
INTERRUPTED = "the run was interrupted (Ctrl-C) during this attempt; it runs again on resume"
"""The error of an attempt cut short by a clean stop (recorded as ``attempt_failed`` with ``interrupted``)."""
"""Outcomes left out of every mean: the agent's reward is unknown."""
_MAX_ERROR_CHARS = 4000
_MODEL_DOWN_STATUSES = (502, 503, 504, 529)
"""Upstream answers that mean the model's side was down or overloaded (529: Anthropic's overloaded)."""
_FAILED = object()
"""What an agent call returns when the agent failed (the result says how)."""


@dataclass(frozen=True, slots=True)
class EpisodeSpec:
    """One scheduled episode."""

    episode_id: str
    """``<task_id>:<sample>``: stable across resumes."""
    task_id: str
    sample: int
    """Index within the task's group (0..episodes_per_task-1)."""
    seed: int


@dataclass(slots=True)
class AttemptResult:
    """How one attempt ended, with its provenance and timings."""

    outcome: str
    reward: float | None = None
    error: str | None = None
    end_reason: str | None = None
    steps: int = 0
    snapshot_id: str | None = None
    start_digest: str | None = None
    sandbox_id: str | None = None
    """The backend's name for the episode's sandbox (a cloud provider's sandbox id on remote backends)."""
    provider: str | None = None
    """The cloud backend that ran it (None: sandboxes on this run's own machines)."""
    verification: str | None = None
    """The verification mode the episode ran in ("strict" or "shared")."""
    reset_latency_ms: float | None = None
    reset_kind: str | None = None
    """How reset() placed the sandbox: ``restored``, ``created`` (a new sandbox: the first episode of an
    environment, or after a crash) or ``pristine`` (restored ahead of time)."""
    agent_s: float = 0.0
    env_s: float = 0.0
    episode_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    network: dict[str, Any] | None = None
    """The episode's connection attempts (``info["network"]``: policy, connections, summary), when audited."""
    trajectory: Trajectory | None = None
    """What the agent did and saw, step by step (written to the episode's folder, not the ledger)."""
    verifier: dict[str, Any] | None = None
    """The verifier's verdict (``info["verifier"]``: reward, output, exit code, ...), for the episode's folder."""
    changes: dict[str, Any] | None = None
    """What the episode added, changed and removed (``info["changes"]``), for the episode's folder."""
    agent_files: dict[str, bytes] | None = None
    """The agent's own logs (an installed agent's, copied out of the sandbox), for the episode's folder."""

    @property
    def is_retryable(self) -> bool:
        """Only infrastructure failures are retried."""
        return self.outcome == INFRA_ERROR


@dataclass(frozen=True, slots=True)
class EpisodeLimits:
    """Per-episode limits of the run."""

    env_id: str
    episode_timeout_s: float | None = None


def play(
    env: gym.Env[Any, str],
    task: Task,
    agent: Agent,
    spec: EpisodeSpec,
    limits: EpisodeLimits,
    durability: Durability | None = None,
    stopping: threading.Event | None = None,
) -> AttemptResult:
    """Play one attempt of ``spec`` in ``env`` (journalled, and going on from the last checkpoint where
    ``durability`` says so: see benchmarks.episodes.recording.durable).

    ``stopping``: once set (Ctrl-C, or the run stopping on an outage or a refused request), the attempt ends
    after its current step (and that step's checkpoint) as an ``infra_error`` whose error is
    :data:`INTERRUPTED`; a resume goes on from its last checkpoint.

    Raises:
        ModelRequestError: the model endpoint refuses every request; the run must stop.
    """
    result = AttemptResult(outcome=INFRA_ERROR)
    durable = DurableAttempt(durability, env, agent) if durability is not None else None
    clock = _Clock(time.perf_counter())
    try:
        _play(env, task, agent, spec, limits, result, clock, durable, stopping)
    except ModelRequestError:
        raise
    except Exception as exc:  # anything the environment raised that it did not classify: infrastructure
        result.outcome, result.error = INFRA_ERROR, _describe(exc, with_traceback=True)
    result.episode_s = time.perf_counter() - clock.started
    if durable is not None:
        result.extra.update(checkpoints=durable.checkpoints, checkpoint_s=durable.checkpoint_s)
        durable.ended(result.outcome)
    return result


@dataclass(slots=True)
class _Clock:
    started: float
    """perf_counter() at the episode's start (earlier than this attempt's, for one resumed at a checkpoint)."""


def _play(
    env: gym.Env[Any, str],
    task: Task,
    agent: Agent,
    spec: EpisodeSpec,
    limits: EpisodeLimits,
    result: AttemptResult,
    clock: _Clock,
    durable: DurableAttempt | None,
    stopping: threading.Event | None = None,
) -> None:
    tool = "python" if limits.env_id.endswith("Python-v0") else "shell"
    context = EpisodeContext(task, env, limits.env_id, spec.seed)
    resumed = _resume(durable, context, task, tool, result, clock) if durable is not None else None
    if resumed is not None:
        obs, info, policy, trajectory = resumed.observation, resumed.info, resumed.policy, resumed.trajectory
        result.trajectory = trajectory
    else:
        obs, info = _reset(env, spec, result)
        if durable is not None:
            durable.started({name: getattr(result, name) for name in PROVENANCE})
        result.trajectory = trajectory = Trajectory(task.instruction, tool)
        policy = _agent_call(result, lambda: agent.start(context))
        if policy is _FAILED:
            return
    while True:
        if stopping is not None and stopping.is_set():
            result.outcome, result.error = INFRA_ERROR, INTERRUPTED
            return
        if _out_of_time(result, limits, clock.started):
            return
        action = _agent_call(result, functools.partial(policy.act, obs, info))
        if action is _FAILED or _out_of_time(result, limits, clock.started):  # an action too late is not played
            return
        step_clock = time.perf_counter()
        try:
            obs, reward, terminated, truncated, info = env.step(action)
        except InvalidActionError as exc:
            obs, reward, terminated, truncated, info = sandbox_env(env).refuse(f"invalid action: {exc}")
        result.env_s += time.perf_counter() - step_clock
        result.steps = int(info.get("step", result.steps + 1))
        trajectory.add(str(action), obs, info, getattr(policy, "last_turn", None))
        if terminated or truncated:
            result.agent_files = getattr(policy, "files", None)
            _finish(result, float(reward), info)
            return
        if durable is not None:
            timings = {
                "episode_s": time.perf_counter() - clock.started,
                "agent_s": result.agent_s,
                "env_s": result.env_s,
            }
            durable.after_step(policy, trajectory, (obs, info), timings)


def _reset(env: gym.Env[Any, str], spec: EpisodeSpec, result: AttemptResult) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start the episode at the task's snapshot, recording where it started."""
    clock = time.perf_counter()
    obs, info = env.reset(seed=spec.seed)
    result.env_s += time.perf_counter() - clock
    result.snapshot_id, result.start_digest = info.get("snapshot_id"), info.get("start_digest")
    result.sandbox_id, result.provider = info.get("sandbox_id"), info.get("provider")
    result.verification = info.get("verification")
    result.reset_latency_ms = float(info.get("reset_latency_s", 0.0)) * 1000
    result.reset_kind = info.get("reset_kind")
    if info.get("resources_not_applied"):  # the ledger says what the backend did not hold the task to
        result.extra["resources_not_applied"] = info["resources_not_applied"]
    if "reused" in info:  # kernel objects of a dead instance the episode started with, each proven clean
        result.extra["reused"] = dict(info["reused"])
    return obs, info


def _resume(
    durable: DurableAttempt, context: EpisodeContext, task: Task, tool: str, result: AttemptResult, clock: _Clock
) -> Resumed | None:
    """Go on from the journal's last checkpoint, when there is one this attempt may use; None: start over
    (the result then says how many journalled steps are played again)."""
    earlier = durable.durability.earlier
    checkpoint = durable.checkpoint_to_resume
    if checkpoint is None:
        if earlier.steps_reached:
            result.extra["steps_replayed"] = earlier.steps_reached
        return None
    try:
        resumed = durable.resume(context, task.instruction, tool)
    except (SnapgymError, AgentError) as exc:
        result.extra.update(steps_replayed=earlier.steps_reached, resume_failed=_describe(exc))
        return None
    for name in PROVENANCE:
        setattr(result, name, earlier.start.get(name))
    result.steps, result.agent_s, result.env_s = checkpoint.step, checkpoint.agent_s, checkpoint.env_s
    result.extra.update(resumed_from_step=checkpoint.step, steps_replayed=0,
                        resumed_from_snapshot=checkpoint.snapshot.get("id"),
                        resume_latency_ms=float(resumed.info.get("reset_latency_s", 0.0)) * 1000)  # fmt: skip
    clock.started -= checkpoint.episode_s
    return resumed


def _out_of_time(result: AttemptResult, limits: EpisodeLimits, started: float) -> bool:
    """Whether the episode has run past its budget (then the result says ``timeout``)."""
    budget = limits.episode_timeout_s
    if budget is None or time.perf_counter() - started <= budget:
        return False
    result.outcome, result.error = TIMEOUT, f"the episode ran past episode_timeout_s={budget}"
    return True


def _agent_call(result: AttemptResult, call: Any) -> Any:
    clock = time.perf_counter()
    try:
        return call()
    except (ModelRequestError, KeyboardInterrupt):
        raise
    except ModelUnavailableError as exc:
        result.outcome, result.error = INFRA_ERROR, _describe(exc)
    except Exception as exc:
        result.outcome, result.error = AGENT_ERROR, _describe(exc, with_traceback=True)
    finally:
        result.agent_s += time.perf_counter() - clock
    return _FAILED


def _finish(result: AttemptResult, reward: float, info: dict[str, Any]) -> None:
    result.end_reason = info.get("end_reason")
    if "end_digest" in info:
        result.extra["end_digest"] = info["end_digest"]
    result.network = info.get("network")
    result.verifier = info.get("verifier")
    result.changes = info.get("changes")
    failure = info.get("network_failure")
    model_down = _model_failure(info.get("network"))
    if failure and info.get("unscored_reason") in (NETWORK_DENIED, NETWORK_UNREACHABLE):
        result.outcome, result.error = info["unscored_reason"], str(failure.get("hint", ""))
        result.extra["network_failure"] = failure
    elif info.get("scored") and reward == 0.0 and model_down is not None:
        result.outcome, result.error = INFRA_ERROR, model_down
    elif info.get("scored"):
        result.outcome, result.reward = SCORED, reward
        if reward == 0.0 and info.get("network_suspect"):
            result.extra["network_suspect"] = info["network_suspect"]
    else:
        result.outcome, result.error = INFRA_ERROR, str(info.get("infra_error", "the episode was not scored"))


def _model_failure(network: dict[str, Any] | None) -> str | None:
    """Why an agent inside the sandbox could not go on, when its last model call says it was the model's
    side: the endpoint unreachable or overloaded (an infrastructure failure, played again).

    Raises:
        ModelRequestError: the endpoint refused the key (401/403): every episode would fail, the run stops.
    """
    calls = (network or {}).get("model_calls") or []
    if not calls:
        return None
    last = calls[-1]
    status, route = last.get("status"), last.get("route")
    if last.get("verdict") == "allowed" and status in (401, 403):
        raise ModelRequestError(
            f"the model endpoint of route {route!r} refused the key with HTTP {status}; check the key's variable "
            "(the route's credential_env) and resume the run"
        )
    if last.get("verdict") == "unreachable" or status in _MODEL_DOWN_STATUSES:
        return f"the agent's model (route {route!r}) was unavailable: {last.get('error') or f'HTTP {status}'}"
    return None


def _describe(exc: BaseException, *, with_traceback: bool = False) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if with_traceback:
        text += "\n" + "".join(traceback.format_tb(exc.__traceback__)[-3:])
    return text[:_MAX_ERROR_CHARS]
