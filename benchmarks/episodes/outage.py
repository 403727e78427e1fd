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

While it waits, the run says so (on stderr and in its log) at least every
``report_every_s``: what is down, since when, when the next probe is, and when
the run gives up.

The breaker: an outage that lasts ``timeout_s`` trips it; every waiting
thread gets :class:`OutageError`, the run stops with what it finished, and a
resume plays the rest (episodes cut short by the outage have no result, so
they are pending).

Never answered: the gate remembers which probes have answered since the run
began (a probe that found it up, or an episode that ended with a result). A
probe that has never answered is not having an outage: its address is wrong or
its service is not running. Its "outage" is retried only ``first_contact_s``,
quietly, then the run stops with :class:`UnreachableError`, naming what was
tried (the probe's words name the URL or address) and what to check.

First contact (:meth:`OutageGate.first_contact`): an endpoint that accepts
requests but never replies fails no attempt for a long time (a request waits
out its whole timeout). A probe that can tell whether it has answered
anything in this run (:class:`Witnessed`: the model endpoint) and has not,
``first_contact_s`` after the episodes began, is probed once; if that fails
too, the run stops with :class:`UnreachableError`, well within 30 s.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from benchmarks.episodes.settings import EpisodeSettings
from pool.errors import SnapgymError

log = logging.getLogger(__name__)


class OutageError(SnapgymError):
    """An outage outlasted ``outage_timeout_s``: the circuit breaker stopped the run (resume it later)."""


FIRST_CONTACT_S = 10.0
"""At the run's start, how long what has never answered is retried before the run stops."""


class UnreachableError(OutageError):
    """Something every episode depends on never answered since the run started: the run stops at once."""


class HealthProbe(Protocol):
    """Something every episode depends on, which can say whether it serves and try to recover."""

    @property
    def health_name(self) -> str:
        """What it is, for messages ("the sandbox pool", "the model endpoint http://...")."""

    @property
    def health_hint(self) -> str:
        """What to check when it never answered ("is the model server running? agent.base_url=...")."""

    def check_health(self) -> str | None:
        """None when it can serve now; otherwise why not, in one line."""

    def recover(self) -> None:
        """Repair what can be repaired (called between probes during an outage); never raises."""


@runtime_checkable
class Witnessed(Protocol):
    """A probe that knows whether what it watches has answered anything in this run (not only a probe)."""

    @property
    def has_answered(self) -> bool:
        """True once it answered a request of the run or a probe."""


@dataclass(frozen=True, slots=True)
class OutagePolicy:
    """How long the runner waits out an outage, and how often it probes."""

    timeout_s: float = EpisodeSettings.outage_timeout_s
    """An outage longer than this trips the breaker (the run's ``outage_timeout_s``)."""
    first_backoff_s: float = 0.5
    """Pause before the second probe of an outage (the first is at once)."""
    max_backoff_s: float = EpisodeSettings.outage_backoff_max_s
    """The pause between probes doubles up to this (the run's ``outage_backoff_max_s``)."""
    first_contact_s: float = FIRST_CONTACT_S
    """At the run's start, how long a probe that has never answered is retried before the run stops."""
    report_every_s: float = 20.0
    """During an outage, the run says how it stands at least this often (and at every probe once probes are
    ``max_backoff_s`` apart, if that is sooner)."""


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
        self._down: HealthProbe | None = None
        self._answered: set[int] = set()
        self._began = 0.0
        self._began_wall = 0.0
        self._reported = 0.0
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

    def served(self, *probes: HealthProbe) -> None:
        """Note that ``probes`` served in this run (none named: all of them, as when an episode ended with a result)."""
        with self._cond:
            self._answered.update(i for i, probe in enumerate(self._probes) if not probes or probe in probes)

    def is_outage(self, epoch: int) -> str | None:
        """After an attempt that started at ``epoch`` failed on infrastructure: the outage that explains
        it, or None when the failure is the attempt's own (everything serves)."""
        with self._probe_lock:
            with self._cond:
                if self._reason is not None:
                    return self._reason
                if self._epoch != epoch:  # one began and ended while the attempt ran
                    return f"the attempt ran during an outage ({self.outages[-1].reason})"
            down = self._check()
            if down is not None:
                self._begin(*down)
            return None if down is None else down[1]

    def first_contact(self, stop: threading.Event) -> UnreachableError | None:
        """Watch the first contact, from the episodes' start: a :class:`Witnessed` probe that has answered
        nothing within ``first_contact_s`` is probed once; the error that stops the run when that fails too
        (it never answered since the run started), else None (also when ``stop`` was set meanwhile)."""
        began = time.monotonic()
        if stop.wait(self._policy.first_contact_s):
            return None
        for index, probe in enumerate(self._probes):
            with self._cond:
                handled = index in self._answered or self._reason is not None  # an outage's own probes go on
            if handled or not isinstance(probe, Witnessed) or probe.has_answered:
                continue
            reason = probe.check_health()
            if reason is None:
                with self._cond:
                    self._answered.add(index)
                continue
            if stop.is_set() or probe.has_answered:
                return None
            lasted = time.monotonic() - began
            return UnreachableError(_never_answered(probe, f"nothing came back in {lasted:.0f} s", reason))
        return None

    def wait(self, stop: threading.Event) -> None:
        """Return when no outage is going on (or ``stop`` is set).

        Raises:
            UnreachableError: what is down never answered since the run started, for ``first_contact_s``.
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
                pause = self._next_pause()
            try:
                if self._pause(pause, stop):
                    self._probe_once()
            finally:
                with self._cond:
                    self._leader = False
                    self._cond.notify_all()

    def _probe_once(self) -> None:
        with self._probe_lock:
            for probe in self._probes:
                probe.recover()
            down = self._check()
        status: str | None = None
        with self._cond:
            self._probes_made += 1
            lasted = time.monotonic() - self._began
            if down is None:
                self.outages.append(Outage(self._reason or "", lasted, self._probes_made, resolved=True))
                status = f"the outage is over after {lasted:.1f} s; the run goes on"
                self._reason = self._down = None
            elif lasted >= self._limit_s():
                self.outages.append(Outage(self._reason or down[1], lasted, self._probes_made, resolved=False))
                self._tripped = self._breaker(down[0], down[1], lasted)
            else:
                doubled = max(self._backoff_s * 2, self._policy.first_backoff_s)
                self._backoff_s = min(doubled, self._policy.max_backoff_s)
                status = self._due_status(self._next_pause())
        if status is not None:
            _announce(status)

    def _breaker(self, probe: HealthProbe, reason: str, lasted: float) -> OutageError:
        """The error that stops the run (called under the condition's lock)."""
        if self._never_answered():
            tries = f"{self._probes_made + 1} tries over {lasted:.0f} s"
            return UnreachableError(_never_answered(probe, tries, reason))
        return OutageError(
            f"an outage lasted {lasted:.1f} s, past outage_timeout_s={self._policy.timeout_s:g}: "
            f"{probe.health_name}: {reason}"
        )

    def _never_answered(self) -> bool:
        return self._down is not None and self._probes.index(self._down) not in self._answered

    def _limit_s(self) -> float:
        """How long this outage may last: ``first_contact_s`` for what never answered, else ``timeout_s``."""
        if self._never_answered():
            return min(self._policy.first_contact_s, self._policy.timeout_s)
        return self._policy.timeout_s

    def _pause(self, pause: float, stop: threading.Event) -> bool:
        """Sleep ``pause`` seconds before the next probe, saying how the outage stands when a report is due;
        False when ``stop`` was set."""
        end = time.monotonic() + pause
        while (left := end - time.monotonic()) > 0:
            if stop.wait(min(left, self._report_every_s())):
                return False
            with self._cond:
                status = self._due_status(end - time.monotonic())
            if status is not None:
                _announce(status)
        return not stop.is_set()

    def _report_every_s(self) -> float:
        return max(0.1, min(self._policy.report_every_s, self._policy.max_backoff_s))

    def _next_pause(self) -> float:
        return min(self._backoff_s, max(0.0, self._began + self._limit_s() - time.monotonic()))

    def _due_status(self, next_probe_s: float) -> str | None:
        """How the outage stands, when a report is due (called under the condition's lock); else None.

        Quiet while what is down never answered: that ends within ``first_contact_s`` in one line of its own.
        """
        now = time.monotonic()
        if self._reason is None or self._never_answered() or now - self._reported < self._report_every_s() - 0.05:
            return None
        self._reported = now
        since = time.strftime("%H:%M:%S", time.gmtime(self._began_wall))
        gives_up = time.strftime("%H:%M:%S", time.gmtime(self._began_wall + self._policy.timeout_s))
        return (
            f"outage: {self._reason}; down since {since} UTC ({now - self._began:.0f} s), "
            f"{self._probes_made} probe(s) so far; next probe in {max(0.0, next_probe_s):.0f} s; the run gives up "
            f"at {gives_up} UTC (outage_timeout_s={self._policy.timeout_s:g}) unless it serves again"
        )

    def _begin(self, probe: HealthProbe, reason: str) -> None:
        with self._cond:
            if self._reason is not None:
                return
            self._epoch += 1
            self._reason = f"{probe.health_name}: {reason}"
            self._down = probe
            self._began = self._reported = time.monotonic()
            self._began_wall = time.time()
            self._probes_made = 0
            self._backoff_s = 0.0
            if self._never_answered():
                log.warning("%s has not answered since the run started: %s", probe.health_name, reason)
                return
            message = (
                f"outage: {self._reason}; attempts wait (not counted against max_attempts) for up to "
                f"outage_timeout_s={self._policy.timeout_s:g} s, saying how it stands at least every "
                f"{self._report_every_s():g} s"
            )
        _announce(message)

    def _check(self) -> tuple[HealthProbe, str] | None:
        """The first probe that cannot serve, and why; None when all can (each one that can has answered)."""
        for index, probe in enumerate(self._probes):
            reason = probe.check_health()
            if reason is not None:
                return probe, reason
            with self._cond:
                self._answered.add(index)
        return None


def _never_answered(probe: HealthProbe, tried: str, reason: str) -> str:
    """The one line of a run stopped because ``probe`` never answered: what was tried, the last error, what to check."""
    return f"{probe.health_name} never answered since the run started ({tried}; last: {reason}); {probe.health_hint}"


def _announce(message: str) -> None:
    """Into the run's log, and onto stderr (the runner's log goes to stdout and its file)."""
    log.warning(message)
    print(f"snapgym: {message}", file=sys.stderr, flush=True)
