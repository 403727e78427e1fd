"""What the episode runner asks of a way to play its episodes elsewhere, and how its own threads claim them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from benchmarks.episodes.attempt import EpisodeSpec
from benchmarks.episodes.recording.ledger import EpisodeLedger
from benchmarks.episodes.recording.records import SessionRecords
from benchmarks.episodes.settings import EvalSettings
from envs.tasks import Task

Claim = Callable[[], EpisodeSpec | None]
"""Hands out the next episode to play (None: there are no more); safe to call from several threads."""


class Run(Protocol):
    """What a spread needs of the runner (an ``Evaluation``): the run's parts, and how to end an episode."""

    agent: Any
    tasks: dict[str, Task]
    settings: EvalSettings
    records: SessionRecords
    ledger: EpisodeLedger

    def end_unscored(self, spec: EpisodeSpec, attempt: int, error: str, *, failures: int) -> None:
        """End ``spec`` as ``infra_error`` after ``attempt``, which failed ``failures`` times in its pass."""


class Spread(Protocol):
    """Plays a run's pending episodes in other processes (:class:`benchmarks.episodes.procs.fleet.Fleet`)."""

    def play(self, evaluation: Run, pending: list[EpisodeSpec]) -> BaseException | None:
        """Play ``pending`` into ``evaluation``'s ledger; returns what stopped the run (None: nothing did).

        Raises:
            RunInterruptedError: Ctrl-C stopped the run.
        """


def claims(pending: Sequence[EpisodeSpec]) -> Claim:
    """A claim that hands out ``pending`` in order, each episode once."""
    specs, lock = iter(list(pending)), threading.Lock()

    def claim() -> EpisodeSpec | None:
        with lock:
            return next(specs, None)

    return claim
