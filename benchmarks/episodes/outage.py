"""Outages: telling them from one attempt's failure, waiting them out with backoff, and the circuit breaker.

An infrastructure failure of one attempt (its sandbox died, the verifier
produced no reward, one request to the model failed) belongs to the attempt
and counts against ``max_attempts``. An *outage* is when what every episode
depends on cannot serve at all: the pool's manager or every host is gone, the
backend's daemon died and no new backend can be opened, Ray is out of reach,
the model endpoint answers no request. Burning attempts then only turns
every episode into a final ``infra_error``; the runner pauses instead.

How an outage is told apart (:meth:`OutageGate.is_outage`): after an attempt
fails on infrastructure, the runner asks each :class:`HealthProbe` (the
sandbox supply; the model endpoint for the llm agent) whether it can serve
now. Any "no" begins an outage, and the failure is its casualty: recorded as
``attempt_failed`` with ``outage: true``, not counted. An attempt during which
an outage began or went on (the gate's ``epoch`` moved since it started) is a
casualty too, without a probe: its failure may well be the outage's doing,
and one extra attempt is cheaper than an attempt burned on the outage.

Waiting (:meth:`OutageGate.wait`, called before every attempt): while an
outage lasts, no attempt starts. One waiting thread at a time asks every probe
to ``recover()`` what it can (a new pool after the manager died, a new backend
after the daemon died) and probes again: at once, then after
``first_backoff_s``, doubling up to ``max_backoff_s``. The first probe that
finds everything up ends the outage and every thread goes on.

The breaker: an outage that lasts ``timeout_s`` trips it; every waiting
thread gets :class:`OutageError`, the run stops with what it finished, and a
resume plays the rest (episodes cut short by the outage have no result, so
they are pending).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from benchmarks.episodes.settings import EpisodeSettings
from pool.errors import SnapgymError

log = logging.getLogger(__name__)


class OutageError(SnapgymError):
    """An outage outlasted ``outage_timeout_s``: the circuit breaker stopped the run (resume it later)."""


class HealthProbe(Protocol):
    """Something every episode depends on, which can say whether it serves and try to recover."""

    @property
    def health_name(self) -> str:
        """What it is, for messages ("the sandbox pool", "the model endpoint http://...")."""

    def check_health(self) -> str | None:
        """None when it can serve now; otherwise why not, in one line."""

    def recover(self) -> None:
        """Repair what can be repaired (called between probes during an outage); never raises."""


@dataclass(frozen=True, slots=True)
class OutagePolicy:
    """How long the runner waits out an outage, and how often it probes."""

    timeout_s: float = EpisodeSettings.outage_timeout_s
    """An outage longer than this trips the breaker (the run's ``outage_timeout_s``)."""
    first_backoff_s: float = 0.5
    """Pause before the second probe of an outage (the first is at once)."""
    max_backoff_s: float = EpisodeSettings.outage_backoff_max_s
    """The pause between probes doubles up to this (the run's ``outage_backoff_max_s``)."""


@dataclass(frozen=True, slots=True)
class Outage:
    """One outage of a session, for the summary."""

    reason: str
    """What the probe said when it began."""
    duration_s: float
    """From its first probe to the probe that found everything up (or to the breaker)."""
    probes: int
    """Probes made while waiting."""
    resolved: bool
    """False: the breaker tripped on it."""


class OutageGate:
    """Shared by the runner's threads: records outages, holds attempts back during one, trips the breaker.

    Args:
        probes: what every episode depends on.
        policy: backoff and the breaker's limit.
    """

    def __init__(self, probes: Sequence[HealthProbe], policy: OutagePolicy) -> None:
        self._probes = tuple(probes)
        self._policy = policy
        self._cond = threading.Condition()
        self._probe_lock = threading.Lock()
        self._epoch = 0
        self._reason: str | None = None
        self._began = 0.0
        self._probes_made = 0
        self._backoff_s = 0.0
        self._leader = False
        self._tripped: OutageError | None = None
        self.outages: list[Outage] = []
        """The session's outages so far."""

    @property
    def epoch(self) -> int:
        """Counts outages begun; an attempt notes it when it starts (see :meth:`is_outage`)."""
        with self._cond:
            return self._epoch

    @property
    def reason(self) -> str | None:
        """Why the current outage began; None when there is none."""
        with self._cond:
            return self._reason

    def is_outage(self, epoch: int) -> str | None:
        """After an attempt that started at ``epoch`` failed on infrastructure: the outage that explains
        it, or None when the failure is the attempt's own (everything serves)."""
        with self._probe_lock:
            with self._cond:
                if self._reason is not None:
                    return self._reason
                if self._epoch != epoch:  # one began and ended while the attempt ran
                    return f"the attempt ran during an outage ({self.outages[-1].reason})"
            reason = self._check()
            if reason is not None:
                self._begin(reason)
            return reason

    def wait(self, stop: threading.Event) -> None:
        """Return when no outage is going on (or ``stop`` is set).

        Raises:
            OutageError: the outage outlasted the policy's ``timeout_s``.
        """
        while not stop.is_set():
            with self._cond:
                if self._tripped is not None:
                    raise self._tripped
                if self._reason is None:
                    return
                if self._leader:
                    self._cond.wait(0.5)
                    continue
                self._leader = True
                pause = min(self._backoff_s, max(0.0, self._began + self._policy.timeout_s - time.monotonic()))
            try:
                if not stop.wait(pause):
                    self._probe_once()
            finally:
                with self._cond:
                    self._leader = False
                    self._cond.notify_all()

    def _probe_once(self) -> None:
        with self._probe_lock:
            for probe in self._probes:
                probe.recover()
            reason = self._check()
        with self._cond:
            self._probes_made += 1
            lasted = time.monotonic() - self._began
            if reason is None:
                self.outages.append(Outage(self._reason or "", lasted, self._probes_made, resolved=True))
                log.warning("the outage is over after %.1f s; the run goes on", lasted)
                self._reason = None
            elif lasted >= self._policy.timeout_s:
                self.outages.append(Outage(self._reason or reason, lasted, self._probes_made, resolved=False))
                self._tripped = OutageError(
                    f"an outage lasted {lasted:.1f} s, past outage_timeout_s={self._policy.timeout_s:g}: {reason}"
                )
            else:
                doubled = max(self._backoff_s * 2, self._policy.first_backoff_s)
                self._backoff_s = min(doubled, self._policy.max_backoff_s)

    def _begin(self, reason: str) -> None:
        with self._cond:
            if self._reason is not None:
                return
            self._epoch += 1
            self._reason = reason
            self._began = time.monotonic()
            self._probes_made = 0
            self._backoff_s = 0.0
        log.warning(
            "outage: %s; attempts wait (not counted against max_attempts) for up to outage_timeout_s=%g s",
            reason,
            self._policy.timeout_s,
        )

    def _check(self) -> str | None:
        for probe in self._probes:
            reason = probe.check_health()
            if reason is not None:
                return f"{probe.health_name}: {reason}"
        return None
