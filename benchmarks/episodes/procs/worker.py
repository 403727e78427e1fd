"""A worker process of the runner: it rebuilds the run (its own backend and sandboxes) and plays what it claims.

Started by :class:`benchmarks.episodes.procs.fleet.Fleet` with the ``spawn`` method (a fresh
interpreter: nothing of the parent's threads or daemons is inherited). It dies with its parent
(``PR_SET_PDEATHSIG``: a parent killed by SIGKILL takes its workers with it, so none goes on
playing while a resume plays the same episodes), ignores Ctrl-C (the parent hears it and tells
every worker to stop), and tells the parent what stopped it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from benchmarks.agents.base import CutsCalls
from benchmarks.episodes.evaluation import Evaluation, RunStoppedError
from benchmarks.episodes.outage import HealthProbe
from benchmarks.episodes.procs.link import ParentLedger
from benchmarks.episodes.settings import EvalSettings
from benchmarks.episodes.sources.routing import Supply
from benchmarks.job import Job
from envs.tasks import Task
from pool.errors import SnapgymError

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class RunSource:
    """What every worker opens the run's sandboxes from (the scenario's; pickled, functions by name)."""

    job_config: DictConfig
    """The job's composed config (the backend the worker opens)."""
    config: DictConfig
    """The run's config (its saved plan on a resume)."""
    output_dir: Path
    overrides: tuple[str, ...]
    open_supply: Callable[[Job, DictConfig], Supply]
    """Opens the run's sandbox supply (``benchmarks.scenarios.eval.open_supply``)."""
    probes: Callable[[Supply, Any], list[HealthProbe]]
    """What every episode depends on (``benchmarks.scenarios.eval.health_probes``)."""


@dataclass(frozen=True, slots=True)
class WorkerRecipe:
    """What a worker process rebuilds its part of the run from (pickled to it)."""

    source: RunSource
    tasks: tuple[Task, ...]
    """The tasks as the parent settled them (network applied, verification mode chosen)."""
    agent: Any
    settings: EvalSettings
    """The run's settings, with this worker's share of the concurrency."""
    run_id: str
    began: float
    """The parent session's start on the monotonic clock (the worker's records share its clock)."""
    ledger_path: Path
    parent_pid: int


def main(recipe: WorkerRecipe, rpc: Connection, control: Connection) -> None:
    """The worker process: play claimed episodes until there are none or the parent says stop."""
    _die_with_parent(recipe.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ledger = ParentLedger(rpc, recipe.ledger_path)
    if isinstance(recipe.agent, CutsCalls):  # a copy of an agent the parent may have cut before
        recipe.agent.allow_calls()
    try:
        _play(recipe, ledger, control)
    except BaseException as exc:  # the parent stops the run, and says why
        ledger.report(exc)
        raise


def _play(recipe: WorkerRecipe, ledger: ParentLedger, control: Connection) -> None:
    source = recipe.source
    job = Job(source.job_config, source.output_dir, source.overrides)
    try:
        supply = source.open_supply(job, source.config)
        try:
            evaluation = Evaluation(list(recipe.tasks), recipe.agent, supply, ledger, recipe.settings,
                                    probes=source.probes(supply, recipe.agent))  # fmt: skip
            evaluation.records.join(recipe.run_id, recipe.began)
            evaluation.run_id = recipe.run_id
            stopped = threading.Event()
            threading.Thread(target=_listen, args=(control, evaluation, stopped), name="snapgym-worker-control",
                             daemon=True).start()  # fmt: skip
            failed = evaluation.prepare(list(evaluation.tasks))
            if failed:
                raise SnapgymError(f"a worker process could not find the snapshots the parent built: {failed}")
            ledger.ready()
            evaluation.play_claimed(ledger.claim, recipe.settings.concurrency)
            if evaluation.fatal is not None:
                ledger.report(evaluation.fatal)
            if recipe.settings.checkpoint_every and (stopped.is_set() or evaluation.fatal is not None):
                with contextlib.suppress(Exception):  # the resume goes on from them (see Evaluation)
                    supply.keep_run_checkpoints()
        finally:
            with contextlib.suppress(Exception):
                supply.close()
    finally:
        job.close()


def _listen(control: Connection, evaluation: Evaluation, stopped: threading.Event) -> None:
    """Stop the worker's episodes when the parent says so (or is gone)."""
    try:
        _, reason = control.recv()
    except (EOFError, OSError):
        reason = RunStoppedError("the runner's parent process is gone")
    stopped.set()
    evaluation.stop(reason)


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent ends (and end now if it already has)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os._exit(1)
