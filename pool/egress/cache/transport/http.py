"""One side of an HTTP/1.1 conversation: h11's state machine over a
:class:`~pool.egress.cache.transport.streams.Stream`."""

from __future__ import annotations

from typing import Any

import h11

from pool.egress.cache.transport.streams import Stream

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te", "trailer",
    "transfer-encoding", "upgrade", "expect",
})  # fmt: skip
"""Headers about one connection, never passed on (the framing is redone by h11 on each side;
``Expect: 100-continue`` is answered by the proxy itself)."""


class Peer:
    """h11's connection state for one side, reading from and writing to ``stream``."""

    def __init__(self, role: type[h11.CLIENT] | type[h11.SERVER], stream: Stream, max_head_bytes: int) -> None:
        self.h11 = h11.Connection(role, max_incomplete_event_size=max_head_bytes)
        self.stream = stream

    async def next_event(self) -> Any:
        """The next event the peer sent (reading as much as that takes).

        Raises:
            h11.RemoteProtocolError: the peer broke HTTP/1.1.
        """
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.h11.receive_data(await self.stream.read())

    async def send(self, event: Any) -> None:
        """Send an event (a request or response head, data, its end)."""
        data = self.h11.send(event)
        if data:
            await self.stream.write(data)

    def reusable(self) -> bool:
        """Whether both sides finished the exchange and the connection may carry another (it is
        then made ready for it)."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False


def text_headers(headers: Any) -> list[tuple[str, str]]:
    """h11's headers as ``(name, value)`` text in their original case and order."""
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers.raw_items()]


def encoded(headers: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> list[tuple[bytes, bytes]]:
    """Text headers as the bytes h11 sends (latin-1, as they were read)."""
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]


def passed_on(headers: list[tuple[str, str]], *, drop: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """``headers`` less :data:`HOP_BY_HOP`, those ``Connection`` names, and ``drop`` (lower case)."""
    named = {token.strip().lower() for value in values(headers, "connection") for token in value.split(",")}
    return [(n, v) for n, v in headers if n.lower() not in HOP_BY_HOP | named | drop]


def values(headers: list[tuple[str, str]], name: str) -> list[str]:
    """Every value of header ``name`` (any case)."""
    wanted = name.lower()
    return [value for key, value in headers if key.lower() == wanted]
