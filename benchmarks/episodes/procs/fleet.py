"""The runner's worker processes: one ledger, several interpreters (``processes=N``).

One Python interpreter plays at most ~120 trivial episodes a second, whatever the cores; with
``processes=N`` the parent starts N worker processes (``spawn``: each rebuilds the run with its own
backend, daemon and sandboxes, see :mod:`benchmarks.episodes.procs.worker`) that play
``pool.size`` episodes at once between them. The parent plays none: it keeps the ledger.

Exactly once. The parent is the ledger's only writer and holds its lock, as a single runner does.
It hands each pending episode to one worker at a time (``claim``), refuses a record of an episode
that worker was not handed, and answers each record only once it is on disk. When a worker ends,
the parent first takes what it had sent (whole messages only), then looks at each episode it held:

- with a result: done;
- with an attempt started and not ended (the worker was killed during it): the attempt is recorded as
  failed (it counts against ``max_attempts``, so an episode that kills its worker every time ends as
  ``infra_error``, or, when the run is stopping, as ``interrupted``, which does not count);
- the episode goes back to the front of the queue (unless the run is stopping), and a new worker
  replaces the dead one (at most ``max_attempts`` times per process).

A parent killed at any point leaves the ledger as a killed single runner does (a torn last line is cut
on resume, unfinished attempts are marked ``interrupted``), and its workers die with it.

Stopping. Ctrl-C (SIGINT to the parent, or to the terminal's whole process group: workers ignore it)
tells every worker to cut its episodes at their next step, each recorded ``interrupted``; a second
Ctrl-C kills the workers at once. What stops one worker (an outage past ``outage_timeout_s``, the
model's refusal, a ledger write that failed) stops them all, and the parent raises it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from benchmarks.episodes.attempt import EpisodeSpec
from benchmarks.episodes.evaluation import RunInterruptedError, RunStoppedError
from benchmarks.episodes.procs import worker
from benchmarks.episodes.procs.link import APPEND, CLAIM, FATAL, READY, STOP
from benchmarks.episodes.procs.spread import Run
from benchmarks.episodes.procs.worker import RunSource, WorkerRecipe
from benchmarks.episodes.recording.ledger import RESULT, LedgerWriteError
from pool.errors import ConfigError

log = logging.getLogger(__name__)
POLL_S = 0.2
"""How often the parent looks at a Ctrl-C while it waits for its workers."""


@dataclass
class _Worker:
    """One worker process, as the parent sees it."""

    number: int
    process: BaseProcess
    rpc: Connection
    control: Connection
    held: dict[str, EpisodeSpec] = field(default_factory=dict)
    """The episodes handed to it without a result yet."""
    closed: bool = False
    """Its request pipe ended (the process is ending)."""


class Fleet:
    """Plays a run's episodes in ``processes`` worker processes sharing the parent's ledger (a ``Spread``).

    Args:
        source: the job's configs and folders, which each worker opens its backend from.
        processes: how many workers play at once (at most ``pool.size``).
        on_result: called in the parent with each result record (the progress bar).
    """

    def __init__(
        self, source: RunSource, processes: int, *, on_result: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        if processes < 2:
            raise ConfigError(f"processes={processes}: a fleet has at least 2 worker processes (1 plays in the parent)")
        self.source = source
        self.processes = processes
        self._on_result = on_result or (lambda record: None)
        self._context = multiprocessing.get_context("spawn")
        self._workers: dict[int, _Worker] = {}
        self._queue: deque[EpisodeSpec] = deque()
        self._fatal: BaseException | None = None
        self._stopping = False
        self._interrupts = 0
        self._started = 0
        self._evaluation: Run | None = None
        self._waiting: list[_Worker] = []
        self._going = False

    # -- the run ----------------------------------------------------------------

    def play(self, evaluation: Run, pending: list[EpisodeSpec]) -> BaseException | None:
        """Play ``pending`` in the workers; returns what stopped the run (None: every episode ended).

        Raises:
            RunInterruptedError: Ctrl-C stopped the run (``at_once`` after a second one).
            ConfigError: the agent cannot be sent to another process.
        """
        self._check_agent(evaluation.agent)
        self._evaluation, self._queue = evaluation, deque(pending)
        self._fatal, self._stopping, self._interrupts, self._started = None, False, 0, 0
        self._waiting, self._going = [], False
        before = self._catch_sigint()
        try:
            for _ in range(min(self.processes, len(pending))):
                self._start()
            self._serve()
        finally:
            self._end_all()
            if before is not None:
                signal.signal(signal.SIGINT, before)
        if self._interrupts:
            raise RunInterruptedError("interrupted: the episodes in flight were cut and run again on resume")
        return self._fatal

    def _serve(self) -> None:
        """Answer the workers until every one has ended."""
        while self._workers:
            if self._interrupts and not self._stopping:
                self._interrupt()
            if self._interrupts > 1:
                raise RunInterruptedError("interrupted twice: stopped at once", at_once=True)
            pipes = {w.rpc: w for w in self._workers.values() if not w.closed}
            ends = {w.process.sentinel: w for w in self._workers.values()}
            ended = []
            for ready in wait([*pipes, *ends], timeout=POLL_S):
                if ready in pipes:
                    self._answer(pipes[ready])
                elif ready in ends:
                    ended.append(ends[ready])
            for who in ended:
                self._ended(who)

    def _answer(self, who: _Worker) -> None:
        """Take one message from ``who`` and answer it."""
        try:
            message = who.rpc.recv()
        except (EOFError, OSError):  # its process is ending: the sentinel says when it has
            who.closed = True
            return
        except Exception as exc:  # a message that does not unpickle: the worker is broken
            self._halt(RunStoppedError(f"worker process {who.number} sent what could not be read: {exc}"))
            who.closed = True
            return
        kind = message[0]
        if kind == FATAL:
            self._halt(message[1])
            return
        if kind == READY:
            self._waiting.append(who)
            self._go()
            return
        reply = self._claim(who) if kind == CLAIM else self._append(who, message[1]) if kind == APPEND else None
        with contextlib.suppress(OSError):
            who.rpc.send(reply)

    def _claim(self, who: _Worker) -> tuple[EpisodeSpec, int, int] | None:
        """The next episode for ``who``, with its attempts and failures so far (None: there are none)."""
        if self._stopping or not self._queue:
            return None
        spec = self._queue.popleft()
        who.held[spec.episode_id] = spec
        state = self._ledger_state()
        return spec, state.attempts.get(spec.episode_id, 0), state.failures.get(spec.episode_id, 0)

    def _append(self, who: _Worker, record: dict[str, Any]) -> BaseException | None:
        """Write ``who``'s record (None), or say why not."""
        episode = record.get("episode_id")
        if episode not in who.held:
            return ConfigError(f"worker process {who.number} sent a record of episode {episode}, not handed to it")
        assert self._evaluation is not None
        try:
            self._evaluation.ledger.append(record)
        except LedgerWriteError as exc:
            self._halt(exc)
            return exc
        except ConfigError as exc:
            return exc
        if record["kind"] == RESULT:
            del who.held[episode]
            self._on_result(record)
        return None

    # -- workers ----------------------------------------------------------------

    def _start(self) -> None:
        evaluation = self._evaluation
        assert evaluation is not None
        number = self._started
        self._started += 1
        settings = dataclasses.replace(evaluation.settings, concurrency=self._share(number), processes=1)
        recipe = WorkerRecipe(
            source=self.source, tasks=tuple(evaluation.tasks.values()), agent=evaluation.agent,
            settings=settings, run_id=evaluation.records.run_id, began=evaluation.records.began,
            ledger_path=evaluation.ledger.path, parent_pid=os.getpid(),
        )  # fmt: skip
        rpc, rpc_child = self._context.Pipe()
        control_child, control = self._context.Pipe(duplex=False)
        process = self._context.Process(target=worker.main, args=(recipe, rpc_child, control_child),
                                        name=f"snapgym-worker-{number}")  # fmt: skip
        process.start()
        rpc_child.close()
        control_child.close()
        self._workers[number] = _Worker(number, process, rpc, control)

    def _go(self) -> None:
        """Let the waiting workers claim episodes once every running one is ready (later ones at once)."""
        if not self._waiting or (not self._going and len(self._waiting) < len(self._workers)):
            return
        self._going = True
        for who in self._waiting:
            with contextlib.suppress(OSError):
                who.rpc.send(None)
        self._waiting.clear()

    def _share(self, number: int) -> int:
        """Worker ``number``'s part of ``pool.size`` (the parts of the first ``processes`` add up to it)."""
        assert self._evaluation is not None
        total = self._evaluation.settings.concurrency
        slot = number % self.processes
        return total // self.processes + (1 if slot < total % self.processes else 0)

    def _ended(self, who: _Worker) -> None:
        """``who``'s process ended: take what it sent, settle the episodes it held, replace it if needed."""
        while not who.closed and who.rpc.poll():
            self._answer(who)
        who.process.join()  # its end was seen; this reaps it, for its exit status
        del self._workers[who.number]
        code = who.process.exitcode
        why = f"worker process {who.number} (pid {who.process.pid}) {_exit(code)}"
        if code != 0:
            log.warning("%s", why)
        for spec in who.held.values():
            self._settle(spec, why)
        if who in self._waiting:
            self._waiting.remove(who)
        self._go()
        who.rpc.close()
        who.control.close()
        if self._queue and not self._stopping:
            self._replace(why)

    def _settle(self, spec: EpisodeSpec, why: str) -> None:
        """An episode whose worker ended before its result: close its attempt, and queue it again."""
        evaluation = self._evaluation
        assert evaluation is not None
        state, episode = evaluation.ledger.state, spec.episode_id
        if episode in state.results:
            return
        attempt = state.unfinished.get(episode)
        try:
            if attempt is not None and self._stopping:
                evaluation.ledger.append(evaluation.records.failed(episode, attempt, why, interrupted=True))
            elif attempt is not None:
                failures = state.failures.get(episode, 0) + 1
                if failures >= evaluation.settings.max_attempts:
                    evaluation.end_unscored(spec, attempt, f"the attempt's {why}", failures=failures)
                    return
                evaluation.ledger.append(evaluation.records.failed(episode, attempt, f"the attempt's {why}"))
        except LedgerWriteError as exc:
            self._halt(exc)
        if not self._stopping:
            self._queue.appendleft(spec)

    def _replace(self, why: str) -> None:
        assert self._evaluation is not None
        if self._started < self.processes * (1 + self._evaluation.settings.max_attempts):
            if len(self._workers) < self.processes:
                self._start()
            return
        if not self._workers:
            self._halt(RunStoppedError(f"the worker processes kept ending before their episodes did (the last: {why})"))

    def _end_all(self) -> None:
        """Kill the workers still running (a second Ctrl-C, or an error in the parent) and wait for them."""
        for who in list(self._workers.values()):
            if who.process.is_alive():
                who.process.kill()
        for who in list(self._workers.values()):
            who.process.join()
            who.rpc.close()
            who.control.close()
        self._workers.clear()

    # -- stopping ---------------------------------------------------------------

    def _halt(self, reason: BaseException) -> None:
        """Stop every worker's episodes because of ``reason`` (the first one stands)."""
        if self._fatal is None and not self._interrupts:
            self._fatal = reason
        self._tell_all(reason)

    def _interrupt(self) -> None:
        in_flight = sum(len(w.held) for w in self._workers.values())
        print(f"\nsnapgym: interrupted; stopping {in_flight} episode(s) in flight in {len(self._workers)} worker "
              "processes at their next step (Ctrl-C again to stop at once)", file=sys.stderr, flush=True)  # fmt: skip
        self._tell_all(None)

    def _tell_all(self, reason: BaseException | None) -> None:
        if self._stopping:
            return
        self._stopping, self._going = True, True
        self._queue.clear()
        self._go()  # a worker still waiting to start hears it has nothing to claim
        for who in self._workers.values():
            with contextlib.suppress(OSError):
                who.control.send((STOP, reason))

    def _catch_sigint(self) -> Any:
        """Count Ctrl-Cs instead of raising (the loop acts on them between messages, never inside a ledger
        write); the handler it replaced (None: not the main thread, where Ctrl-C cannot be caught)."""
        if threading.current_thread() is not threading.main_thread():
            return None

        def count(signum: int, frame: Any) -> None:
            self._interrupts += 1

        return signal.signal(signal.SIGINT, count)

    def _check_agent(self, agent: Any) -> None:
        try:
            pickle.dumps(agent)
        except Exception as exc:
            raise ConfigError(
                f"processes={self.processes}: the agent {getattr(agent, 'name', agent)!r} cannot be sent to worker "
                f"processes ({type(exc).__name__}: {exc}); run it with processes=1"
            ) from None

    def _ledger_state(self) -> Any:
        assert self._evaluation is not None
        return self._evaluation.ledger.state


def _exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return "ended" if code == 0 else f"exited with status {code}"
