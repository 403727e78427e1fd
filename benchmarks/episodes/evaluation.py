"""The episode runner: play every scheduled episode once, retry infrastructure failures, record all.

The plan is ``episodes_per_task`` episodes of each task (episode ids
``<task>:<i>``, seeds ``seed + i``). Episodes run on ``concurrency`` threads
(of ``processes`` worker processes when above 1: ``benchmarks.episodes.procs``),
each with its own environment; the agent loop runs here, the actions in the
sandboxes. Each attempt is announced in the ledger before it starts, and its
end is appended (and fsync-ed) before the thread moves on, so a runner killed
at any moment can be resumed: episodes with a result are skipped, attempts
cut short are marked ``interrupted`` and run again under a new attempt id,
and episodes that ended as ``infra_error`` are played again (their result is
``superseded``, see ``benchmarks.episodes.recording.ledger``).

An infrastructure failure is first checked against an outage (see
``benchmarks.episodes.outage``): during one, failed attempts are not counted against
``max_attempts`` and no attempt starts until the supply (and the model
endpoint) serve again; an outage longer than ``outage_timeout_s`` stops the run.
What never answered since the run started stops it within ``first_contact_s``.
Durations and deadlines come from monotonic clocks; the wall-clock ``at``,
``started_at`` and ``finished_at`` fields are for people reading the ledger.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym

from benchmarks.agents.base import Agent, CutsCalls, ModelRequestError
from benchmarks.episodes.attempt import INFRA_ERROR, INTERRUPTED, AttemptResult, EpisodeLimits, EpisodeSpec, play
from benchmarks.episodes.outage import HealthProbe, Outage, OutageError, OutageGate, OutagePolicy, UnreachableError
from benchmarks.episodes.procs.spread import Claim, Spread, claims
from benchmarks.episodes.recording import episodefiles
from benchmarks.episodes.recording.durable import Durability
from benchmarks.episodes.recording.journal import EpisodeJournal
from benchmarks.episodes.recording.ledger import EpisodeLedger, LedgerWriteError, attempt_id
from benchmarks.episodes.recording.records import SessionRecords, Started
from benchmarks.episodes.settings import EvalSettings as EvalSettings  # declared with the episode settings
from benchmarks.episodes.sources.routing import Supply
from envs.spaces.tokens import token_lines
from envs.tasks import Task
from envs.wrappers import sandbox_env
from pool.errors import SnapgymError
from pool.labels import RUN
from pool.resources import DEFAULT_TIMEOUT_S

log = logging.getLogger(__name__)


class RunStoppedError(SnapgymError):
    """The run stopped before every episode ended (the ledger keeps what finished; resume it)."""


class RunInterruptedError(RunStoppedError):
    """Ctrl-C stopped the run: cleanly (the episodes in flight cut at their next step, recorded as
    ``interrupted``), or ``at_once`` after a second Ctrl-C (the ledger holds what finished)."""

    def __init__(self, message: str, *, at_once: bool = False) -> None:
        super().__init__(message)
        self.at_once = at_once


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
        probes: what every episode depends on, asked after an infrastructure failure whether
            it is an outage (default: the supply alone; the llm agent adds its endpoint).
        spread: plays the episodes in worker processes instead of this one's threads.
    """

    def __init__(
        self,
        tasks: Sequence[Task],
        agent: Agent,
        supply: Supply,
        ledger: EpisodeLedger,
        settings: EvalSettings,
        *,
        on_result: Callable[[dict[str, Any]], None] | None = None,
        probes: Sequence[HealthProbe] | None = None,
        spread: Spread | None = None,
    ) -> None:
        self.tasks = {task.id: task for task in tasks}
        self.agent = agent
        self.supply = supply
        self.ledger = ledger
        self.settings = settings
        self.records = SessionRecords(agent=agent.name, env_id=settings.env_id,
                                      success_threshold=settings.success_threshold)  # fmt: skip
        self.run_id = self.records.run_id
        self._on_result = on_result or (lambda record: None)
        policy = OutagePolicy(settings.outage_timeout_s, max_backoff_s=settings.outage_backoff_max_s)
        self._gate = OutageGate([supply] if probes is None else probes, policy)
        self._snapshots: dict[str, Any] = {}
        self._stop = threading.Event()
        self._interrupted = threading.Event()
        self._sigint_before: Any = None
        self._fatal: BaseException | None = None
        self._fatal_lock = threading.Lock()
        self._local = threading.local()
        self._envs: list[gym.Env[Any, str]] = []
        self._envs_lock = threading.Lock()
        self._spread = spread

    @property
    def outages(self) -> list[Outage]:
        """This session's outages."""
        return list(self._gate.outages)

    def plan(self) -> list[EpisodeSpec]:
        """Every scheduled episode."""
        return plan_episodes(list(self.tasks.values()), self.settings.episodes_per_task, self.settings.seed)

    def pending(self) -> list[EpisodeSpec]:
        """Scheduled episodes that have no standing result yet."""
        return [spec for spec in self.plan() if spec.episode_id not in self.ledger.state.results]

    def final_results(self) -> int:
        """Scheduled episodes whose result is final (an ``infra_error`` is not: a run plays it again)."""
        results = self.ledger.state.results
        return sum(1 for s in self.plan() if results.get(s.episode_id, {}).get("outcome", INFRA_ERROR) != INFRA_ERROR)

    def run(self) -> None:
        """Play every pending episode.

        Raises:
            RunStoppedError: the model endpoint refused requests.
            RunInterruptedError: Ctrl-C (KeyboardInterrupt) stopped the run.
            UnreachableError: what every episode depends on never answered since the run started.
            OutageError: an outage outlasted ``outage_timeout_s`` (the circuit breaker).
            LedgerWriteError: a record could not be written (the ledger stays whole).
        """
        if isinstance(self.agent, CutsCalls):
            self.agent.allow_calls()
        try:
            self._mark_interrupted()
            self._reopen_infra_errors()
            self._play(self._build(self.pending()))
        except OutageError as exc:
            self._halt(exc)
        finally:
            self._keep_checkpoints_for_resume()
        if self._fatal is not None:
            self._raise_fatal(self._fatal)

    def _play(self, pending: list[EpisodeSpec]) -> None:
        if self._spread is None or not pending:
            self.play_claimed(claims(pending), len(pending))
        elif (fatal := self._spread.play(self, pending)) is not None:
            self._halt(fatal)

    def play_claimed(self, claim: Claim, most: int) -> None:
        """Play the episodes ``claim`` hands out (None: there are no more), ``concurrency`` (at most ``most``)
        at a time, each thread claiming its next one when it is done with the last.

        Raises:
            RunInterruptedError: Ctrl-C (KeyboardInterrupt) stopped the run.
        """
        # What exists now (modules, configs, the plan) lives for the whole run: keep it out of the
        # collector's full passes, which would otherwise walk it every few hundred episodes. The
        # garbage goes first, and the freeze ends with the run (a notebook runs many in one process).
        gc.collect()
        gc.freeze()
        workers = max(1, min(self.settings.concurrency, most))
        executor = ThreadPoolExecutor(workers, thread_name_prefix="snapgym-episode")
        played = threading.Event()
        threading.Thread(target=self._watch_first_contact, args=(played,), name="snapgym-first-contact",
                         daemon=True).start()  # fmt: skip
        try:
            for future in [executor.submit(self._claiming, claim) for _ in range(workers)]:
                future.result()
        except KeyboardInterrupt:
            self._stop_cleanly(executor)
        finally:
            played.set()
            executor.shutdown(wait=not self._interrupted.is_set(), cancel_futures=True)
            self._close_envs()
            gc.unfreeze()
            if self._sigint_before is not None:  # a notebook's kernel goes on taking Ctrl-C
                signal.signal(signal.SIGINT, self._sigint_before)

    def _stop_cleanly(self, executor: ThreadPoolExecutor) -> None:
        """Ctrl-C: let the episodes in flight end at their next step (a second Ctrl-C stops at once).

        Raises:
            RunInterruptedError: always; ``at_once`` after a second Ctrl-C (then SIGINT is ignored while the
                environments close, so no sandbox is left behind).
        """
        self._interrupted.set()
        self._stop.set()
        self._cut_calls()
        in_flight = len(self.ledger.state.unfinished)
        print(f"\nsnapgym: interrupted; stopping {in_flight} episode(s) in flight at their next step "
              "(Ctrl-C again to stop at once)", file=sys.stderr, flush=True)  # fmt: skip
        try:
            executor.shutdown(wait=True, cancel_futures=True)
        except KeyboardInterrupt:
            if threading.current_thread() is threading.main_thread():
                self._sigint_before = signal.signal(signal.SIGINT, signal.SIG_IGN)
            raise RunInterruptedError("interrupted twice: stopped at once", at_once=True) from None
        raise RunInterruptedError("interrupted: the episodes in flight were cut and run again on resume")

    def stop(self, reason: BaseException | None = None) -> None:
        """Stop the run from outside (a worker process's parent): with no ``reason`` as Ctrl-C does (the
        episodes in flight are cut at their next step, recorded ``interrupted``), else as ``reason`` halts it."""
        if reason is not None:
            self._halt(reason)
            return
        self._interrupted.set()
        self._stop.set()
        self._cut_calls()

    @property
    def fatal(self) -> BaseException | None:
        """What stopped the run (an outage, a ledger write, the model's refusal), or None."""
        return self._fatal

    def _keep_checkpoints_for_resume(self) -> None:
        """While an episode has no final result (stopped, or ended by its infrastructure), a resume goes on from
        its checkpoints: the backend keeps them when it closes."""
        if self.settings.checkpoint_every and self.final_results() < len(self.plan()):
            with contextlib.suppress(Exception):  # a backend that is gone keeps nothing anyway
                self.supply.keep_run_checkpoints()

    def _halt(self, exc: BaseException) -> None:
        with self._fatal_lock:
            if self._fatal is None:
                self._fatal = exc
        self._stop.set()
        self._cut_calls()

    def _cut_calls(self) -> None:
        """The run is stopping: an agent's model requests in flight end now, not after their timeout."""
        if isinstance(self.agent, CutsCalls):
            self.agent.cut_calls()

    def _watch_first_contact(self, played: threading.Event) -> None:
        """Stop the run when what it depends on has answered nothing since it began (an endpoint that accepts
        requests and never replies fails no attempt before a request's timeout)."""
        error = self._gate.first_contact(played)
        if error is not None and not played.is_set():
            self._halt(error)

    def _raise_fatal(self, fatal: BaseException) -> None:
        resume = f"resume=true output_dir={self.ledger.path.parent}"
        if isinstance(fatal, LedgerWriteError | UnreachableError):
            raise fatal
        if isinstance(fatal, OutageError):
            done = f"{self.final_results()} of {len(self.plan())} episodes have a final result"
            raise OutageError(f"{fatal}; {done}; when it is back, play the rest with {resume}") from fatal
        raise RunStoppedError(f"the run stopped: {fatal}") from fatal

    # -- one episode ----------------------------------------------------------

    def _claiming(self, claim: Claim) -> None:
        while not self._stop.is_set() and (spec := claim()) is not None:
            self._episode(spec)

    def _episode(self, spec: EpisodeSpec) -> None:
        try:
            self._play_episode(spec)
        except (OutageError, LedgerWriteError) as exc:
            self._halt(exc)

    def _play_episode(self, spec: EpisodeSpec) -> None:
        state = self.ledger.state
        while not self._stop.is_set():
            self._gate.wait(self._stop)
            if self._stop.is_set():
                return
            attempt = state.attempts.get(spec.episode_id, 0) + 1
            epoch = self._gate.epoch
            self.ledger.append(self.records.attempt(spec.episode_id, attempt))
            started = self.records.now()
            try:
                result = self._attempt(spec, attempt)
            except ModelRequestError as exc:
                self._halt(exc)
                return
            if self._interrupted.is_set() and result.is_retryable:  # cut by Ctrl-C, or its sandbox closed by it
                self.ledger.append(self.records.failed(spec.episode_id, attempt, INTERRUPTED, interrupted=True))
                return
            if self._stop.is_set() and result.is_retryable:  # cut as the run stopped: not counted, played on resume
                why = f"the run stopped during this attempt: {type(self._fatal).__name__}"
                error = why if result.error == INTERRUPTED else result.error
                self.ledger.append(self.records.failed(spec.episode_id, attempt, error, outage=why))
                return
            outage = self._gate.is_outage(epoch) if result.is_retryable else None
            if outage is not None:
                self.ledger.append(self.records.failed(spec.episode_id, attempt, result.error, outage=outage))
                self._drop_env()
                continue
            failures = state.failures.get(spec.episode_id, 0) + (1 if result.is_retryable else 0)
            if result.is_retryable and failures < self.settings.max_attempts:
                self.ledger.append(self.records.failed(spec.episode_id, attempt, result.error))
                self._drop_env()
                continue
            if not result.is_retryable:
                self._gate.served()
            record = self._result(spec, attempt, result, started, failures)
            self.ledger.append(record)
            self._on_result(record)
            self._idle_env()
            return

    def _attempt(self, spec: EpisodeSpec, attempt: int) -> AttemptResult:
        task = self.tasks[spec.task_id]
        limits = EpisodeLimits(self.settings.env_id, self.settings.episode_timeout_s)
        try:
            env = self._env_for(task)
        except Exception as exc:  # a pool that is gone may raise Ray's errors here, not only ours
            return AttemptResult(INFRA_ERROR, error=f"could not make the environment: {type(exc).__name__}: {exc}")
        result = play(env, task, self.agent, spec, limits, self._durability(spec, attempt), self._stop)
        if (chosen_by := self.settings.verification_chosen_by.get(task.id)) is not None:
            result.extra["verification_chosen_by"] = chosen_by
        return result

    def _durability(self, spec: EpisodeSpec, attempt: int) -> Durability | None:
        """How the attempt is journalled (None: checkpoints are off)."""
        if not self.settings.checkpoint_every:
            return None
        journal = EpisodeJournal(self.ledger.path.parent / episodefiles.journal_file(spec.task_id, spec.sample))
        return Durability(journal, attempt, self.settings.checkpoint_every, journal.load())

    def _env_for(self, task: Task) -> gym.Env[Any, str]:
        """This thread's environment for ``task``; a new one after the supply replaced its backend or pool."""
        key = (task.id, self.supply.generation)
        current = getattr(self._local, "env", None)
        if current is not None and getattr(self._local, "key", None) == key:
            return current  # type: ignore[no-any-return]
        self._drop_env()
        options: dict[str, Any] = {
            "max_steps": self.settings.max_steps,
            "step_timeout_s": self._step_timeout_s(task),
            "max_action_bytes": self.settings.max_action_bytes,
        }
        if self.settings.run_id:  # on the sandboxes the run's backend makes here (a pool's hosts label theirs)
            options["labels"] = {RUN: self.settings.run_id}
        if self.settings.verification is not None:
            options["verification"] = self.settings.verification
        if self.settings.network is not None:
            options["network"] = self.settings.network
        if self.settings.checkpoint_every:
            options["end_digest"] = True
        env = self.supply.make_env(self.settings.env_id, task, **options)
        with self._envs_lock:
            self._envs.append(env)
        self._local.env, self._local.key = env, key
        return env

    def _step_timeout_s(self, task: Task) -> float:
        if self.agent.whole_task_steps:  # the task's agent timeout; without one, Harbor's default
            return task.settings.agent_timeout_s or max(self.settings.step_timeout_s, DEFAULT_TIMEOUT_S)
        return self.settings.step_timeout_s

    def _idle_env(self) -> None:
        """Say the finished episode's environment waits: a pooled one gives its lease back, so a thread
        waiting for a sandbox is not starved by one that has nothing left to run (the pool may hold fewer
        sandboxes than there are threads)."""
        env = getattr(self._local, "env", None)
        if env is not None:
            with contextlib.suppress(Exception):
                sandbox_env(env).idle()

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
        why = "the runner stopped during this attempt; it runs again on resume"
        for episode_id, attempt in sorted(self.ledger.state.unfinished.items()):
            self.ledger.append(self.records.failed(episode_id, attempt, why, interrupted=True))

    def _reopen_infra_errors(self) -> None:
        """Supersede the ``infra_error`` results of the plan's episodes, so they are played again."""
        why = "an infrastructure failure is not final: the episode is played again"
        results = self.ledger.state.results
        for spec in self.plan():
            result = results.get(spec.episode_id)
            if result is not None and result.get("outcome") == INFRA_ERROR:
                self.ledger.append(self.records.superseded(spec.episode_id, int(result["attempt"]), why))

    def _build(self, pending: list[EpisodeSpec]) -> list[EpisodeSpec]:
        """Build the snapshots the pending episodes need; a task that fails to build ends its episodes."""
        failed = self.prepare(list(dict.fromkeys(spec.task_id for spec in pending)))
        for spec in pending:
            if spec.task_id in failed:
                attempt = self.ledger.state.attempts.get(spec.episode_id, 0) + 1
                self.ledger.append(self.records.attempt(spec.episode_id, attempt))
                self.end_unscored(spec, attempt, failed[spec.task_id], failures=1)
        return [spec for spec in pending if spec.task_id not in failed]

    def prepare(self, task_ids: Sequence[str]) -> dict[str, str]:
        """Build (or find) the tasks' snapshots; why each one that failed did, by task id."""
        failed: dict[str, str] = {}
        for task_id in task_ids:
            error = self._build_task(self.tasks[task_id])
            if error is not None:
                failed[task_id] = error
                log.error("task %s: %s", task_id, error)
        return failed

    def end_unscored(self, spec: EpisodeSpec, attempt: int, error: str, *, failures: int) -> None:
        """End ``spec`` as ``infra_error`` after ``attempt`` (recorded as started): its task did not build, or
        the worker processes playing it died ``failures`` times."""
        record = self._result(spec, attempt, AttemptResult(INFRA_ERROR, error=error), self.records.now(), failures)
        self.ledger.append(record)
        self._on_result(record)

    def _build_task(self, task: Task) -> str | None:
        """Build one task's snapshot, waiting out an outage; the error when the build itself failed."""
        while True:
            epoch = self._gate.epoch
            try:
                self._snapshots[task.id] = self.supply.build(task)
                self._gate.served(self.supply)
                return None
            except SnapgymError as exc:
                error = f"building the task's snapshot failed: {type(exc).__name__}: {exc}"
            if self._gate.is_outage(epoch) is None:
                return error
            self._gate.wait(self._stop)

    def _result(
        self, spec: EpisodeSpec, attempt: int, result: AttemptResult, started: Started, failures: int
    ) -> dict[str, Any]:
        snapshot = self._snapshots.get(spec.task_id)
        run_dir, folder = self.ledger.path.parent, episodefiles.episode_dir(spec.task_id, spec.sample, attempt)
        files = {"dir": folder, "result": f"{folder}/{episodefiles.RESULT_FILE}"}
        try:
            if result.trajectory is not None:
                atif = result.trajectory.as_atif(
                    session_id=attempt_id(spec.episode_id, attempt), agent=self.agent.name, env_id=self.settings.env_id,
                    model_name=getattr(self.agent, "model", None),
                    model_calls=(result.network or {}).get("model_calls") or (),
                )  # fmt: skip
                files["trajectory"] = episodefiles.write_trajectory(run_dir, folder, atif)
                lines = token_lines(atif)
                if lines:
                    files["tokens"] = episodefiles.write_tokens(run_dir, folder, lines)
            if result.verifier is not None:
                files.update(episodefiles.write_verifier(run_dir, folder, result.verifier))
            if result.changes is not None:
                files["diff"] = episodefiles.write_changes(run_dir, folder, result.changes)
            if result.agent_files:
                files.update(episodefiles.write_agent_files(run_dir, folder, result.agent_files))
            if result.network and (result.network.get("connections") or result.network.get("model_calls")):
                files["network"] = episodefiles.write_network(run_dir, folder, result.network)
        except OSError as exc:  # the episode's files are a convenience: the ledger holds the result
            log.warning("the files of episode %s could not be written: %s", spec.episode_id, exc)
        backend = self.supply.for_task(self.tasks[spec.task_id]).name
        record = self.records.result(spec, attempt, result, started=started, failures=failures, snapshot=snapshot,
                                     backend=backend, files=files)  # fmt: skip
        with contextlib.suppress(OSError):
            episodefiles.write_json(run_dir, files["result"], record)
        return record
