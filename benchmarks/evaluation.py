"""The episode runner: play every scheduled episode once, retry infrastructure failures, record all.

The plan is ``episodes_per_task`` episodes of each task (episode ids
``<task>:<i>``, seeds ``seed + i``). Episodes run on ``concurrency`` threads,
each with its own environment; the agent loop runs here, the actions in the
sandboxes. Each attempt is announced in the ledger before it starts, and its
end is appended (and fsync-ed) before the thread moves on, so a runner killed
at any moment can be resumed: episodes with a result are skipped, attempts
cut short are marked ``interrupted`` and run again under a new attempt id.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym

from benchmarks.agents.base import Agent, ModelRequestError
from benchmarks.episodes import INFRA_ERROR, AttemptResult, EpisodeLimits, EpisodeSpec, play
from benchmarks.ledger import ATTEMPT, ATTEMPT_FAILED, RESULT, Ledger, attempt_id
from benchmarks.supply import SandboxSupply
from envs.tasks import Task
from pool.errors import SnapgymError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EvalSettings:
    """What the runner needs from the config."""

    env_id: str = "snapgym/Shell-v0"
    """The environment every episode runs in."""
    episodes_per_task: int = 1
    """Episodes of each task (a group, for pass@k)."""
    seed: int = 0
    """Episode i of a task gets ``seed + i``."""
    concurrency: int = 4
    """Episodes played at once (threads)."""
    max_steps: int = 50
    """Steps before an episode is truncated."""
    step_timeout_s: float = 120.0
    """Timeout of one action."""
    episode_timeout_s: float | None = None
    """Wall-clock budget of an episode, agent included."""
    max_attempts: int = 3
    """Attempts of an episode whose infrastructure failed."""
    success_threshold: float = 1.0
    """A reward at or above this is a pass."""
    verification: str | None = None
    """"strict" or "shared" for every episode; None: each task's own mode."""


class RunStoppedError(SnapgymError):
    """The run stopped before every episode ended (the ledger keeps what finished; resume it)."""


def plan_episodes(tasks: Sequence[Task], episodes_per_task: int, seed: int) -> list[EpisodeSpec]:
    """Every scheduled episode, sample-major, so early results cover every task."""
    return [
        EpisodeSpec(f"{task.id}:{sample}", task.id, sample, seed + sample)
        for sample in range(episodes_per_task)
        for task in tasks
    ]


class Evaluation:
    """Runs a plan of episodes into a ledger.

    Args:
        tasks: the suite.
        agent: plays every episode.
        supply: builds snapshots and makes environments.
        ledger: where every attempt and result goes (possibly holding an earlier run's records).
        settings: the run's settings.
        on_result: called with each result record (the progress bar).
    """

    def __init__(
        self,
        tasks: Sequence[Task],
        agent: Agent,
        supply: SandboxSupply,
        ledger: Ledger,
        settings: EvalSettings,
        *,
        on_result: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.tasks = {task.id: task for task in tasks}
        self.agent = agent
        self.supply = supply
        self.ledger = ledger
        self.settings = settings
        self.run_id = uuid.uuid4().hex[:12]
        self._on_result = on_result or (lambda record: None)
        self._snapshots: dict[str, Any] = {}
        self._stop = threading.Event()
        self._fatal: BaseException | None = None
        self._local = threading.local()
        self._envs: list[gym.Env[Any, str]] = []
        self._envs_lock = threading.Lock()

    def pending(self) -> list[EpisodeSpec]:
        """Scheduled episodes that have no result yet."""
        plan = plan_episodes(list(self.tasks.values()), self.settings.episodes_per_task, self.settings.seed)
        return [spec for spec in plan if spec.episode_id not in self.ledger.state.results]

    def run(self) -> None:
        """Play every pending episode.

        Raises:
            RunStoppedError: the model endpoint refused requests, or the run was interrupted.
        """
        self._mark_interrupted()
        pending = self.pending()
        pending = self._build(pending)
        workers = max(1, min(self.settings.concurrency, len(pending)))
        executor = ThreadPoolExecutor(workers, thread_name_prefix="snapgym-episode")
        try:
            for future in [executor.submit(self._episode, spec) for spec in pending]:
                future.result()
        except KeyboardInterrupt:
            self._stop.set()
            executor.shutdown(wait=True, cancel_futures=True)
            raise RunStoppedError("interrupted; episodes in flight will run again when the run resumes") from None
        finally:
            executor.shutdown(wait=True)
            self._close_envs()
        if self._fatal is not None:
            raise RunStoppedError(f"the run stopped: {self._fatal}") from self._fatal

    # -- one episode ----------------------------------------------------------

    def _episode(self, spec: EpisodeSpec) -> None:
        state = self.ledger.state
        while not self._stop.is_set():
            attempt = state.attempts.get(spec.episode_id, 0) + 1
            self.ledger.append(self._attempt_record(spec, attempt))
            started_at = time.time()
            try:
                result = self._attempt(spec)
            except ModelRequestError as exc:
                self._fatal = exc
                self._stop.set()
                return
            failures = state.failures.get(spec.episode_id, 0) + (1 if result.is_retryable else 0)
            if result.is_retryable and failures < self.settings.max_attempts:
                self.ledger.append(self._failure_record(spec, attempt, result))
                self._drop_env()
                self.supply.recover()
                continue
            record = self._result_record(spec, attempt, result, started_at, failures)
            self.ledger.append(record)
            self._on_result(record)
            if self.supply.pool is not None:
                self._release_sandbox()
            return

    def _attempt(self, spec: EpisodeSpec) -> AttemptResult:
        task = self.tasks[spec.task_id]
        limits = EpisodeLimits(self.settings.env_id, self.settings.episode_timeout_s)
        try:
            env = self._env_for(task)
        except SnapgymError as exc:
            return AttemptResult(INFRA_ERROR, error=f"could not make the environment: {type(exc).__name__}: {exc}")
        return play(env, task, self.agent, spec, limits)

    def _env_for(self, task: Task) -> gym.Env[Any, str]:
        current = getattr(self._local, "env", None)
        if current is not None and getattr(self._local, "task_id", None) == task.id:
            return current  # type: ignore[no-any-return]
        self._drop_env()
        options: dict[str, Any] = {"max_steps": self.settings.max_steps, "step_timeout_s": self.settings.step_timeout_s}
        if self.settings.verification is not None:
            options["verification"] = self.settings.verification
        env = self.supply.make_env(self.settings.env_id, task, **options)
        with self._envs_lock:
            self._envs.append(env)
        self._local.env, self._local.task_id = env, task.id
        return env

    def _release_sandbox(self) -> None:
        """Give the finished episode's lease back, so a thread waiting for a sandbox is not starved
        by one that has nothing left to run (the pool may hold fewer sandboxes than there are threads)."""
        env = getattr(self._local, "env", None)
        if env is not None:
            with contextlib.suppress(Exception):
                env.unwrapped.release_sandbox()

    def _drop_env(self) -> None:
        env = getattr(self._local, "env", None)
        self._local.env = None
        if env is not None:
            with self._envs_lock:
                self._envs.remove(env)
            with contextlib.suppress(Exception):
                env.close()

    def _close_envs(self) -> None:
        with self._envs_lock:
            envs, self._envs = self._envs, []
        for env in envs:
            with contextlib.suppress(Exception):
                env.close()

    # -- before the episodes --------------------------------------------------

    def _mark_interrupted(self) -> None:
        for episode_id, attempt in sorted(self.ledger.state.unfinished.items()):
            self.ledger.append(
                {
                    "kind": ATTEMPT_FAILED,
                    "run_id": self.run_id,
                    "episode_id": episode_id,
                    "attempt": attempt,
                    "attempt_id": attempt_id(episode_id, attempt),
                    "interrupted": True,
                    "error": "the runner stopped during this attempt; it runs again on resume",
                    "at": time.time(),
                }
            )

    def _build(self, pending: list[EpisodeSpec]) -> list[EpisodeSpec]:
        """Build the snapshots the pending episodes need; a task that fails to build ends its episodes."""
        failed: dict[str, str] = {}
        for task_id in dict.fromkeys(spec.task_id for spec in pending):
            try:
                self._snapshots[task_id] = self.supply.build(self.tasks[task_id])
            except SnapgymError as exc:
                failed[task_id] = f"building the task's snapshot failed: {type(exc).__name__}: {exc}"
                log.error("task %s: %s", task_id, failed[task_id])
        for spec in pending:
            if spec.task_id in failed:
                attempt = self.ledger.state.attempts.get(spec.episode_id, 0) + 1
                self.ledger.append(self._attempt_record(spec, attempt))
                result = AttemptResult(INFRA_ERROR, error=failed[spec.task_id])
                record = self._result_record(spec, attempt, result, time.time(), 1)
                self.ledger.append(record)
                self._on_result(record)
        return [spec for spec in pending if spec.task_id not in failed]

    # -- records ----------------------------------------------------------------

    def _attempt_record(self, spec: EpisodeSpec, attempt: int) -> dict[str, Any]:
        return {
            "kind": ATTEMPT,
            "run_id": self.run_id,
            "episode_id": spec.episode_id,
            "attempt": attempt,
            "attempt_id": attempt_id(spec.episode_id, attempt),
            "at": time.time(),
        }

    def _failure_record(self, spec: EpisodeSpec, attempt: int, result: AttemptResult) -> dict[str, Any]:
        return {
            "kind": ATTEMPT_FAILED,
            "run_id": self.run_id,
            "episode_id": spec.episode_id,
            "attempt": attempt,
            "attempt_id": attempt_id(spec.episode_id, attempt),
            "interrupted": False,
            "error": result.error,
            "at": time.time(),
        }

    def _result_record(
        self, spec: EpisodeSpec, attempt: int, result: AttemptResult, started_at: float, failures: int
    ) -> dict[str, Any]:
        snapshot = self._snapshots.get(spec.task_id)
        fields = asdict(result)
        extra = fields.pop("extra")
        passed = result.reward is not None and result.reward >= self.settings.success_threshold
        return {
            "kind": RESULT,
            "run_id": self.run_id,
            **asdict(spec),
            "attempt": attempt,
            "attempt_id": attempt_id(spec.episode_id, attempt),
            "infra_failures": failures,
            **fields,
            "passed": passed,
            "task_snapshot_id": getattr(snapshot, "id", None),
            "task_snapshot_digest": getattr(snapshot, "digest", None),
            "backend": self.supply.name,
            "agent": self.agent.name,
            "env_id": self.settings.env_id,
            "started_at": started_at,
            "finished_at": time.time(),
            **extra,
        }
