"""The episode lifecycle every snapgym environment shares.

``reset()`` puts the sandbox back at the task's snapshot (or a checkpoint),
``step()`` runs one action, and the episode ends when the agent submits
(:data:`SUBMIT`) or runs out of steps or time; then the verifier scores the
end state. Subclasses say only how an action runs (:meth:`SandboxEnv._run`).

Infrastructure failures (the sandbox died, the backend failed, the verifier's
sandbox could not start) end the episode with ``truncated=True``,
``info["scored"] = False`` and the error in ``info["infra_error"]``; the
reward of such a step is 0.0 and must not be read as the agent's score. A
verifier that ran but left no valid reward scores 0.0 (see envs.tasks.verifier:
whatever the agent did to its sandbox, it gets a verdict).
"""

from __future__ import annotations

import abc
import contextlib
import os
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

from envs.episode.clock import AgentClock
from envs.episode.endstate import end_digest
from envs.episode.network import NetworkSetting, template_for
from envs.episode.pause import PausedEpisode, check_resumable, claim, paused
from envs.episode.resume import check_reset_options, episode_start, start_info
from envs.episode.scoring import AGENT_ENDED, agents_end, changes_info, judge, outcome, record_network
from envs.episode.seeding import LazilySeeded
from envs.episode.sources import SandboxLeaser, SandboxSource, open_source
from envs.episode.state import EpisodeState, check_not_closed, check_running
from envs.episode.taskset import Setup, TaskSampler, TaskSet, check_playable
from envs.errors import InvalidActionError
from envs.spaces.actions import SUBMIT, check_action
from envs.spaces.observations import NO_COMMAND, exec_info, make_observation, observation_space, observe
from envs.spaces.text import UnicodeText
from envs.tasks.protect import known_good_of
from envs.tasks.task import Task, load_task
from pool.capabilities import Capabilities, EgressControl, Location
from pool.changes import Changes
from pool.contract import Backend, Sandbox
from pool.errors import CommandRejectedError, ConfigError, SandboxError, SnapgymError, UnsupportedError
from pool.network.policy import Phase, PhasePolicies
from pool.results import ExecResult
from pool.snapshots import Snapshot
from pool.verification import VerifyMode

_MAX_REASON_CHARS = 2000


class SandboxEnv(LazilySeeded, gym.Env[dict[str, Any], str], abc.ABC):
    """A Gymnasium environment whose episodes run in a snapgym sandbox.

    Args:
        task: a built-in task id, a task directory, or a loaded Task.
        backend: where sandboxes run: a backend, or a backend's name (``"local"``, ``"docker"``;
            one shared backend per name and options in this process). Default: ``"local"``.
        backend_options: the named backend's options (its constructor's keyword arguments).
        labels: labels every sandbox this environment makes carries (e.g. the runner's
            ``snapgym.run``), besides the backend's own ``snapgym.owner``.
        pool: a :class:`pool.SandboxPool` to lease sandboxes from instead of a backend.
        source: where sandboxes come from, already chosen (see envs.episode.sources; the runner gives
            its run's); instead of ``backend`` and ``pool``. ``labels`` are added to it.
        max_steps: steps before the episode is truncated (the verifier still runs).
        step_timeout_s: timeout of one action; a timeout is an observation.
        max_action_bytes: the largest action accepted (UTF-8 bytes).
        max_output_bytes: cap on each of stdout and stderr in an observation.
        bases: image -> base spec for Dockerfile ``FROM`` lines (see pool.build.dockerfile).
        verification: ``"strict"``, ``"toolchain"`` or ``"shared"`` for every episode; None: what the task
            declares (strict when it declares nothing). See envs.tasks.verifier.
        network: the network of every episode: None or ``"task"`` (the task's policy per
            phase, Harbor's default ``public``), ``"offline"``, ``"public"``, a list of
            allowed hosts, a :class:`pool.egress.NetworkPolicy`, or ``{"agent": ...,
            "verifier": ...}``. See envs.episode.network; ``info["network"]`` shows what was tried.
        render_mode: ``"ansi"`` returns the last observation's text from render().
        tasks: a task set (ids, directories or Tasks): each ``reset()`` picks one, by
            ``reset(options={"task": id})`` or else by ``task_sampler`` (default: uniform,
            from the environment's seeded ``np_random``); ``task`` is ignored then. Each task's
            snapshot is built on its first episode.
        task_sampler: ``(np_random, task_ids) -> task_id``, the next episode's task.
        end_digest: at the end of each episode, put the digest of the end state (see
            envs.episode.endstate) in ``info["end_digest"]`` (it reads every changed file).
        protect_outputs: the verifier takes the test infrastructure in the outputs (``conftest.py``,
            pytest's configuration...) from the known-good snapshot (see envs.tasks.protect).
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 1}  # noqa: RUF012 (Gymnasium's convention)
    own_paths: frozenset[str] = frozenset()
    """Files the environment itself keeps in the sandbox, left out of ``info["changes"]``."""
    state_in_files: bool = True
    """Whether a checkpoint holds what the next step depends on (the shell's working directory and
    exported variables are in a file); False for an interpreter whose variables live in a process."""

    def __init__(
        self,
        task: str | Path | Task = "log-error-count",
        *,
        backend: Backend | str | None = None,
        backend_options: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
        pool: SandboxLeaser | None = None,
        source: SandboxSource | None = None,
        max_steps: int = 50,
        step_timeout_s: float = 120.0,
        max_action_bytes: int = 64 * 1024,
        max_output_bytes: int = 64 * 1024,
        bases: Mapping[str, str] | None = None,
        verification: str | VerifyMode | None = None,
        network: NetworkSetting = None,
        render_mode: str | None = None,
        tasks: Sequence[str | Path | Task] | None = None,
        task_sampler: TaskSampler | None = None,
        end_digest: bool = False,
        protect_outputs: bool = True,
    ) -> None:
        if max_steps < 1 or step_timeout_s <= 0 or max_action_bytes < 1 or max_output_bytes < 1:
            raise ConfigError("max_steps, step_timeout_s, max_action_bytes and max_output_bytes must be positive")
        if render_mode not in (None, "ansi"):
            raise ConfigError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if backend is not None and pool is not None:
            raise ConfigError("give a backend or a pool, not both")
        if source is not None and (backend is not None or pool is not None or backend_options):
            raise ConfigError("give a source, or a backend or a pool, not both")
        if tasks is not None and not tasks:
            raise ConfigError("tasks must name at least one task")
        loaded = [load_task(t, bases=bases) for t in tasks] if tasks is not None else [load_task(task, bases=bases)]
        self._taskset = TaskSet(loaded, verification=verification, network=network, sampler=task_sampler)
        self.tasks: dict[str, Task] = self._taskset.tasks
        """The task set (one task unless ``tasks`` was given)."""
        self.task_sampler = task_sampler
        self._setups: dict[str, tuple[Setup, Snapshot]] = {}
        self.task = loaded[0]
        self._setup = self._taskset.setup(self.task)
        if source is None:
            source = open_source(backend, backend_options=backend_options, pool=pool, labels=labels)
        elif labels:
            source = source.labelled(labels)
        self._source: SandboxSource = source
        self._capabilities: Capabilities = source.capabilities
        self.max_steps = max_steps
        self.step_timeout_s = step_timeout_s
        self.max_action_bytes = max_action_bytes
        self.max_output_bytes = max_output_bytes
        self.render_mode = render_mode
        self.action_space = UnicodeText(max_action_bytes)
        longest = max(len(t.instruction) for t in self.tasks.values())
        self.observation_space = observation_space(2 * max_output_bytes + longest + 256)
        for each in loaded:  # every task must be playable here, before any is built
            check_playable(each, self._taskset.setup(each), self._capabilities, source.description)
        self.task_snapshot = self._source.prepare(template_for(self.task.template, self.network))
        self._setups[self.task.id] = (self._setup, self.task_snapshot)
        self._sandbox: Sandbox | None = None
        self._pristine_at: str | None = None
        self.fork_point: Snapshot | None = None
        """Where a plain ``reset()`` starts a child of ``fork()`` (None: the task's snapshot)."""
        self.end_digest = end_digest
        self.protect_outputs = protect_outputs
        self._state = EpisodeState.NEEDS_RESET
        self._steps = 0
        self._clock = AgentClock()
        self._changes_before: Changes | None = None
        self._last_text = ""

    # -- Gymnasium API --------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode at the task's snapshot, or at ``options["snapshot"]``.

        Returns the instruction as the observation; ``info`` holds the task id, the snapshot id, where it
        started (``started_at``: ``task``, ``fork`` for a child of ``fork()``, ``snapshot``, or
        ``checkpoint``), the start state's digest and the reset latency.

        ``options["resume_at"]`` (with a ``snapshot`` from :meth:`checkpoint`) goes on with an episode that
        was checkpointed there: ``{"step": steps taken, "elapsed_s": seconds of the task's agent time used,
        "changes": info-style changes at the checkpoint}``. The step count and the agent's clock go on from
        there (no extra steps or time), and the end-state changes are the whole episode's.
        """
        self.seed_lazily(seed)  # gymnasium's reset(seed=...) without building the generator until used
        check_not_closed(self._state)
        options = dict(options or {})
        check_reset_options(options)
        if "task" in options or (len(self.tasks) > 1 and not options.get("snapshot") and self.fork_point is None):
            self._switch_to(self._taskset.pick(options.get("task"), self.np_random))
        start = episode_start(options, fork_point=self.fork_point, task_snapshot=self.task_snapshot,
                              max_steps=self.max_steps)  # fmt: skip
        started = time.perf_counter()
        reset_kind = self._place_sandbox(start.target)
        self._apply_network(Phase.AGENT)
        self._on_episode_start()
        latency = time.perf_counter() - started
        self._state = EpisodeState.RUNNING
        resumed = start.resume_at
        self._steps, self._changes_before = (resumed.step, resumed.changes) if resumed else (0, None)
        self._clock.start(resumed.elapsed_s if resumed else 0.0)
        assert self._sandbox is not None
        remote = self._capabilities.sandbox_location == Location.REMOTE
        info = start_info(self.task.id, start, self._sandbox, self._source.name, remote=remote)
        info.update(reset_latency_s=latency, reset_kind=reset_kind, verification=self.verification.value,
                    network=self.network.as_dict())  # fmt: skip
        self._last_text = self.task.instruction
        return make_observation(self.task.instruction, NO_COMMAND), info

    def step(self, action: str) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Run one action; at the end of the episode the verifier's reward comes back."""
        check_running(self._state)
        check_action(action, self.max_action_bytes)
        if action.strip() == SUBMIT:
            info = {"step": self._steps, "exec_duration_s": 0.0}
            return self._end(make_observation("[submitted]", NO_COMMAND), info, "submitted")
        try:
            result = self._run(action)
        except SandboxError as exc:
            return self._step_failed(exc)
        return self._after_command(observe(result), {**exec_info(result)})

    def _step_failed(self, exc: SandboxError) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """The step whose action raised ``exc``: refused, the agent's end (scored), or the infrastructure's."""
        if isinstance(exc, CommandRejectedError):
            raise InvalidActionError(str(exc)) from None
        if isinstance(exc, AGENT_ENDED):  # the agent's own doing: the episode ends and is scored
            self._steps += 1
            what, reason = agents_end(exc)
            info = {"step": self._steps, "exec_duration_s": 0.0}
            return self._end(make_observation(f"[{what}: {exc}]", NO_COMMAND), info, reason)
        return self._infra_failure(exc, {"step": self._steps + 1})

    def render(self) -> str | None:
        """The last observation's text in ``"ansi"`` mode."""
        return self._last_text if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Release the sandbox. Idempotent; the backend stays open if it was given."""
        if self._state is EpisodeState.CLOSED:
            return
        self._state = EpisodeState.CLOSED
        if self._sandbox is not None:
            sandbox, self._sandbox = self._sandbox, None
            with contextlib.suppress(SnapgymError):
                sandbox.close()
        super().close()

    # -- branching ------------------------------------------------------------

    def pause(self, *, carry: Mapping[str, Any] | None = None, claims_dir: str | Path | None = None) -> PausedEpisode:
        """Checkpoint the running episode and let its sandbox go; any environment of the task goes on with it
        by :meth:`resume`, exactly once (see envs.episode.pause). ``carry``: JSON values for the handle."""
        check_running(self._state)
        if not self.state_in_files:
            raise UnsupportedError(f"{type(self).__name__} keeps its state in a process, not in files: it cannot pause")
        snapshot = self.checkpoint()
        handle = paused(self.task.id, snapshot, step=self._steps, elapsed_s=self._clock.elapsed_s,
                        changes=self.episode_changes(), claims_dir=claims_dir, carry=carry)  # fmt: skip
        self.release_sandbox()
        return handle

    def resume(self, handle: PausedEpisode | Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Go on with a paused episode (its handle or ``handle.to_dict()``), as ``reset()`` does with
        ``resume_at``: steps are numbered on from the pause. Raises AlreadyResumedError the second time."""
        check_not_closed(self._state)
        handle = check_resumable(handle, self.tasks)
        claim(handle, by=f"pid {os.getpid()} on {socket.gethostname()}")
        at = {"step": handle.step, "elapsed_s": handle.elapsed_s, "changes": handle.changes}
        return self.reset(options={"task": handle.task_id, "snapshot": handle.snapshot, "resume_at": at})

    def checkpoint(self) -> Snapshot:
        """Snapshot the current episode state; start episodes from it with ``reset(options={"snapshot": s})``
        or :meth:`fork`. The snapshot holds the sandbox's files, not its processes (nor a Python env's
        variables). The time it takes is not charged to the task's agent time."""
        check_running(self._state)
        assert self._sandbox is not None
        with self._clock.paused():
            return self._sandbox.snapshot()

    def fork(self, n: int, snapshot: Snapshot | None = None) -> list[SandboxEnv]:
        """``n`` new environments whose sandboxes already sit at ``snapshot``.

        Each child's ``reset()`` starts at the fork point (its first one is free: the sandbox is already
        there), every time, and ``info["started_at"]`` says ``"fork"``; ``reset(options={"snapshot":
        child.task_snapshot})`` starts one at the task's start instead. ``reset()`` comes before ``step()``.
        Without a snapshot, the current state is checkpointed first. Close each child when done; the
        children share this environment's backend."""
        if n < 1:
            raise ConfigError(f"fork needs n >= 1, got {n}")
        snapshot = snapshot or self.checkpoint()
        sandboxes = self._source.fork(snapshot, n, task_snapshot=self.task_snapshot)
        children = []
        for sandbox in sandboxes:
            child = self._sibling()
            child._sandbox = sandbox
            child._pristine_at = snapshot.id
            child.fork_point = snapshot
            children.append(child)
        return children

    def release_sandbox(self) -> None:
        """Hand the sandbox back between episodes (to the pool, which restores it for the next holder); the
        next ``reset()`` leases (or creates) another. Call it when an environment will sit idle while others
        need sandboxes (an idle one on a pool keeps its lease). A running episode is abandoned unjudged."""
        check_not_closed(self._state)
        self._discard_sandbox()
        self._state = EpisodeState.NEEDS_RESET

    def idle(self) -> None:
        """Say that the environment will wait before its next episode: a pooled sandbox goes back to the
        pool (the next ``reset()`` leases another), so that an idle environment does not starve busy ones;
        a backend's sandbox stays, for an in-place restore. An episode still running is abandoned."""
        check_not_closed(self._state)
        if self._sandbox is not None:
            sandbox, self._sandbox = self._sandbox, None
            self._sandbox = self._source.idle(sandbox)
        if self._sandbox is None:
            self._state = EpisodeState.NEEDS_RESET

    # -- for subclasses and wrappers ------------------------------------------

    @abc.abstractmethod
    def _run(self, action: str) -> ExecResult:
        """Run one action in the sandbox."""

    def _on_episode_start(self) -> None:
        """Called after the sandbox is at the episode's start state."""

    @property
    def _has_egress(self) -> bool:
        """Whether the backend puts a network policy into its sandboxes (else they have loopback only)."""
        return self._capabilities.egress_control != EgressControl.LOOPBACK_ONLY

    def _apply_network(self, phase: Phase) -> None:
        """Give the sandbox the phase's policy, where the backend controls egress."""
        if self._has_egress:
            assert self._sandbox is not None
            self._sandbox.set_network(self.network.for_phase(phase), phase=phase)

    def _switch_to(self, task: Task) -> None:
        """Make ``task`` the current one (its snapshot is built the first time)."""
        if task.id not in self._setups:
            setup = self._taskset.setup(task)
            self._setups[task.id] = (setup, self._source.prepare(template_for(task.template, setup.network)))
        self.task = task
        self._setup, self.task_snapshot = self._setups[task.id]

    def _sibling(self) -> SandboxEnv:
        """A new environment like this one, without a sandbox yet."""
        return type(self)(
            self.task,
            source=self._source,
            max_steps=self.max_steps,
            step_timeout_s=self.step_timeout_s,
            max_action_bytes=self.max_action_bytes,
            max_output_bytes=self.max_output_bytes,
            verification=self._taskset.verification,
            network=self._taskset.network,
            render_mode=self.render_mode,
            end_digest=self.end_digest,
        )

    def refuse(self, reason: str) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Count a step whose action was refused (by a policy) without running it."""
        check_running(self._state)
        reason = str(reason)[:_MAX_REASON_CHARS]
        obs = make_observation(f"[refused: {reason}]", NO_COMMAND)
        return self._after_command(obs, {"refused": reason, "exec_duration_s": 0.0})

    @property
    def verification(self) -> VerifyMode:
        """The verifier's mode in the current task's episodes."""
        return self._setup.verification

    @property
    def network(self) -> PhasePolicies:
        """The network policy of each phase of the current task's episodes."""
        return self._setup.network

    @property
    def source(self) -> SandboxSource:
        """Where this environment's sandboxes come from (its children's too)."""
        return self._source

    @property
    def backend(self) -> Backend | None:
        """The backend that makes this environment's sandboxes here (None: they come from a pool)."""
        return self._source.backend

    @property
    def sandbox(self) -> Sandbox | None:
        """The sandbox of the current episode (None before the first reset)."""
        return self._sandbox

    @property
    def state(self) -> EpisodeState:
        """Where the environment is in its life."""
        return self._state

    @property
    def steps(self) -> int:
        """Steps taken in the current episode."""
        return self._steps

    @property
    def elapsed_s(self) -> float:
        """Seconds of the current episode so far, on the clock of the task's agent timeout."""
        return self._clock.elapsed_s

    # -- internals ------------------------------------------------------------

    def _after_command(
        self, obs: dict[str, Any], info: dict[str, Any]
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        self._steps += 1
        info["step"] = self._steps
        self._pristine_at = None
        reason = self.end_reason(self._steps)
        if reason is not None:
            return self._end(obs, info, reason)
        self._last_text = obs["output"]
        return obs, 0.0, False, False, info

    def end_reason(self, steps: int) -> str | None:
        """Why the episode ends once ``steps`` steps are taken (None: it goes on): ``max_steps``, ``agent_timeout``."""
        if steps >= self.max_steps:
            return "max_steps"
        return "agent_timeout" if self._clock.is_over(self.task.settings.agent_timeout_s) else None

    def _end(
        self, obs: dict[str, Any], info: dict[str, Any], reason: str
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        self._state = EpisodeState.ENDED
        self._last_text = obs["output"]
        assert self._sandbox is not None
        info["changes"] = self.episode_changes()
        if self.end_digest:
            info["end_digest"], why_not = end_digest(self._sandbox, info["changes"], self.task_snapshot.digest)
            if why_not is not None:
                info["end_digest_unavailable"] = why_not
        snap, fresh = self.task_snapshot, lambda: self._source.fork(self.task_snapshot, 1, task_snapshot=snap)[0]
        protection = known_good_of(self.task, snap, fresh) if self.protect_outputs else None
        verdict = judge(self._sandbox, self.task, self._setup, known_good=snap, env=self._episode_env(),
                        has_egress=self._has_egress, protection=protection)  # fmt: skip
        info.update(
            end_reason=reason, verifier=verdict.as_info(), scored=verdict.reward is not None,
            verification=self.verification.value,
        )  # fmt: skip
        audited = self._capabilities.egress_audit
        failure = record_network(self._sandbox, info, verdict, self._setup) if audited else None
        reward, terminated, truncated = outcome(info, verdict, failure, reason)
        return obs, reward, terminated, truncated, info

    def episode_changes(self) -> dict[str, Any]:
        """What the episode has added, changed and removed so far against the task's snapshot (at the
        end: as the agent left it, before the verifier), or ``{"unavailable": why}``."""
        assert self._sandbox is not None
        return changes_info(self._sandbox, self._capabilities, backend=self._source.name,
                            own_paths=self.own_paths, before=self._changes_before)  # fmt: skip

    def _infra_failure(
        self, exc: Exception, info: dict[str, Any]
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        self._state = EpisodeState.ENDED
        self._discard_sandbox()
        info.update(end_reason="infra_error", scored=False, infra_error=f"{type(exc).__name__}: {exc}")
        obs = make_observation(f"[infrastructure failure: {exc}]", NO_COMMAND)
        self._last_text = obs["output"]
        return obs, 0.0, False, True, info

    def _place_sandbox(self, target: Snapshot) -> str:
        """Put a sandbox at ``target``; how: ``pristine`` (restored ahead of time), ``restored`` or ``created``."""
        if self._sandbox is not None and self._pristine_at == target.id and self._sandbox.is_alive:
            self._pristine_at = None
            return "pristine"
        current, self._sandbox = self._sandbox, None
        self._sandbox = self._source.place(current, target, task_snapshot=self.task_snapshot)
        self._pristine_at = None
        return "created" if current is None else "restored"

    def _discard_sandbox(self) -> None:
        if self._sandbox is not None:
            sandbox, self._sandbox = self._sandbox, None
            with contextlib.suppress(SnapgymError):
                sandbox.close()

    def _action_timeout_s(self) -> float:
        """The step timeout, cut to what is left of the task's agent time budget."""
        return self._clock.cap(self.step_timeout_s, self.task.settings.agent_timeout_s)

    def _episode_env(self) -> dict[str, str]:
        return dict(self.task.settings.environment.env)

    def validate_action(self, action: Any) -> None:
        """Raise :class:`InvalidActionError` unless ``action`` could be run."""
        check_action(action, self.max_action_bytes)
