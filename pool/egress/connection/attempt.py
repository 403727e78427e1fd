"""One connection's audit record while the connection runs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pool.network.audit import INVALID, Connection

MAX_TEXT_CHARS = 300
"""The longest rule or error kept in a record."""


@dataclass(slots=True)
class Attempt:
    """A :class:`Connection` being filled in.

    Mutable on purpose (unlike the record it becomes): the steps of serving a connection each
    add what they learn, and whatever ends the connection (its own end, a timeout, a cut) turns
    it into a record with :meth:`record`. Until a step says otherwise it is an invalid request.
    """

    phase: str
    kind: str = "http"
    host: str = ""
    port: int = 0
    verdict: str = INVALID
    rule: str = "invalid request"
    address: str | None = None
    sni: str | None = None
    url: str | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    error: str | None = None
    cache: str | None = None
    is_broken: bool = False
    """The transfer broke off mid-way (:meth:`broke`): the client's connection ends with a reset."""
    started: float = field(default_factory=time.time)
    _clock: float = field(default_factory=time.monotonic)

    def decided(self, verdict: str, rule: str, error: str | None = None) -> None:
        """Set the verdict and the rule (and why it failed, for unreachable and invalid ones)."""
        self.verdict, self.rule, self.error = verdict, _capped(rule), None if error is None else _capped(error)

    def broke(self, why: str) -> None:
        """The transfer broke off mid-way (``why``, the record's error): what was sent still reaches
        the client, then its connection is reset, so that it sees a failed transfer, never an end of
        stream it could take for the end of a whole one."""
        self.error, self.is_broken = _capped(why), True

    def up(self, count: int) -> None:
        """Count bytes sent to the destination."""
        self.bytes_up += count

    def down(self, count: int) -> None:
        """Count bytes sent to the client."""
        self.bytes_down += count

    def lost(self, count: int) -> None:
        """``count`` of the bytes sent to the client will never reach it (its connection is reset
        with them still queued: it stopped reading): they are not counted, and the record says the
        transfer was cut."""
        if count <= 0:
            return
        self.bytes_down = max(0, self.bytes_down - count)
        cut = f"cut: {count} bytes never reached the client"
        self.error = _capped(f"{self.error}; {cut}" if self.error else cut)

    def record(self) -> Connection:
        """The audit record, as of now."""
        return Connection(
            time=self.started,
            phase=self.phase,
            kind=self.kind,
            host=self.host,
            port=self.port,
            verdict=self.verdict,
            rule=self.rule,
            address=self.address,
            sni=self.sni,
            url=self.url,
            bytes_up=self.bytes_up,
            bytes_down=self.bytes_down,
            duration_s=round(time.monotonic() - self._clock, 6),
            error=None if self.error is None else _capped(self.error),
            cache=self.cache,
        )


def _capped(text: str) -> str:
    # Rules and errors may quote what the client sent; a record stays small whatever it sent.
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 3] + "..."
