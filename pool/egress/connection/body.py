"""HTTP bodies on a plain proxy request: the request's forwarded exactly as far as its head says
it goes, the answer's followed to tell whether it ended whole.

The proxy forwards one request per connection. Bytes after the body would be a
second request on the same connection to the same server, never checked
against the policy (a different ``Host``, for one), so they are not forwarded;
and a head whose framing two servers could read differently (both
``Content-Length`` and ``Transfer-Encoding``, or conflicting lengths: request
smuggling) is refused before anything is sent.

The answer passes unchanged, but :class:`AnswerFraming` reads its framing as it goes: a
destination that closes before the ``Content-Length`` it announced, or inside a chunked body,
ended the transfer short, and the proxy records that and resets the client's connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from pool.egress.connection.head import RequestHead
from pool.egress.connection.relay import CHUNK_BYTES, Activity, send

_MAX_CHUNK_LINE = 4096
_BODILESS_STATUSES = frozenset({204, 304})


@dataclass(frozen=True, slots=True)
class Framing:
    """How a request's body ends: after ``length`` bytes, or at the last chunk when ``chunked``."""

    length: int = 0
    chunked: bool = False


def framing(head: RequestHead) -> Framing:
    """The body framing that ``head`` declares.

    Raises:
        ValueError: the framing is ambiguous or malformed.
    """
    lengths = head.values("Content-Length")
    codings = [c.strip().lower() for value in head.values("Transfer-Encoding") for c in value.split(",")]
    if codings:
        if lengths:
            raise ValueError("both Content-Length and Transfer-Encoding")
        if codings[-1] != "chunked" or head.version == "HTTP/1.0":
            raise ValueError("a Transfer-Encoding that does not end in chunked")
        return Framing(chunked=True)
    if not lengths:
        return Framing()
    if len(set(lengths)) != 1 or not lengths[0].isdigit() or len(lengths[0]) > 18:
        raise ValueError("conflicting or malformed Content-Length")
    return Framing(length=int(lengths[0]))


async def copy_body(
    body: Framing,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    count: Callable[[int], None],
    activity: Activity,
) -> None:
    """Forward the body declared by ``body`` from ``reader`` to ``writer``, and no more.

    Raises:
        ValueError: a chunk header is malformed.
        asyncio.IncompleteReadError: the client ended before the body did.
    """
    if not body.chunked:
        await _copy(body.length, reader, writer, count, activity)
        return
    while True:
        line = await _line(reader)
        await _forward(line, writer, count, activity)
        size_text = line.split(b";", 1)[0].strip()
        if not size_text or len(size_text) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size_text):
            raise ValueError("malformed chunk size")
        size = int(size_text, 16)
        if size == 0:
            break
        await _copy(size, reader, writer, count, activity)
        if (end := await reader.readexactly(2)) != b"\r\n":
            raise ValueError("chunk data not followed by CRLF")
        await _forward(end, writer, count, activity)
    while (line := await _line(reader)) != b"\r\n":  # trailer fields, then the empty line
        await _forward(line, writer, count, activity)
    await _forward(line, writer, count, activity)


async def _copy(
    size: int,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    count: Callable[[int], None],
    activity: Activity,
) -> None:
    while size > 0:
        data = await reader.read(min(size, CHUNK_BYTES))
        if not data:
            raise asyncio.IncompleteReadError(b"", size)
        size -= len(data)
        activity.touch()
        await _forward(data, writer, count, activity)


async def _line(reader: asyncio.StreamReader) -> bytes:
    line = await reader.readuntil(b"\n")
    if len(line) > _MAX_CHUNK_LINE or not line.endswith(b"\r\n"):
        raise ValueError("malformed chunk line")
    return line


async def _forward(data: bytes, writer: asyncio.StreamWriter, count: Callable[[int], None], activity: Activity) -> None:
    await send(writer, data, activity)
    count(len(data))


class AnswerFraming:
    """Follows a destination's answer to a plain proxy request as it passes, to tell at its end
    whether it ended whole (the bytes themselves pass unchanged; this only reads them).

    Args:
        method: the request's method (the answer to ``HEAD`` has no body).
        max_head_bytes: past this much head, or on framing it cannot read, it stops judging.
    """

    def __init__(self, method: str, max_head_bytes: int) -> None:
        self._is_head_request = method == "HEAD"
        self._max_head_bytes = max_head_bytes
        self._state = "head"
        self._pending = b""
        self._left = 0
        self._body_bytes = 0
        self._length = 0

    def feed(self, data: bytes) -> None:
        """Read the next bytes of the answer."""
        if self._state in ("done", "unknown"):
            return
        if self._state == "length":
            self._take_length(len(data))
            return
        if self._state == "data" and len(data) < self._left:  # the common case, without copying
            self._left -= len(data)
            return
        self._pending += data
        while self._pending and self._state not in ("done", "unknown") and self._step():
            pass

    def shortfall(self) -> str | None:
        """At the destination's end of stream: why the answer is not whole, or None when it is
        (or its framing is its end of stream, or could not be read)."""
        if self._state == "head":
            return "closed before its answer's head ended" if self._pending else "closed without answering"
        if self._state == "length":
            return f"closed after {self._body_bytes} of the {self._length} body bytes it announced"
        if self._state in ("size", "data", "crlf", "trailer"):
            return "closed inside its chunked body, before the last chunk"
        return None

    def _take_length(self, count: int) -> None:
        self._body_bytes += count
        if self._body_bytes >= self._length:
            self._state = "done"

    def _step(self) -> bool:
        """Consume what the pending bytes allow in the current state; False when it needs more."""
        if self._state == "data":
            taken = min(self._left, len(self._pending))
            self._left -= taken
            self._pending = self._pending[taken:]
            if self._left == 0:
                self._state = "crlf"
            return True
        end = self._pending.find(b"\r\n\r\n" if self._state == "head" else b"\r\n")
        limit = self._max_head_bytes if self._state in ("head", "trailer") else _MAX_CHUNK_LINE
        if end < 0:
            if len(self._pending) > limit:
                self._state = "unknown"
            return False
        size = end + (4 if self._state == "head" else 2)
        unit, self._pending = self._pending[:size], self._pending[size:]
        self._read(unit)
        return True

    def _read(self, unit: bytes) -> None:
        if self._state == "head":
            self._read_head(unit)
        elif self._state == "size":
            self._read_size(unit)
        elif self._state == "crlf":
            self._state = "size" if unit == b"\r\n" else "unknown"
        elif unit == b"\r\n":  # the empty line that ends the trailer
            self._state = "done"

    def _read_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            self._state = "unknown"
            return
        status = int(parts[1])
        if 100 <= status < 200:  # an interim answer (101 switches to another protocol)
            self._state = "head" if status != 101 else "unknown"
            return
        fields = [line.split(":", 1) for line in lines[1:] if ":" in line]
        lengths = {value.strip() for name, value in fields if name.strip().lower() == "content-length"}
        codings = [
            c.strip().lower() for name, value in fields if name.strip().lower() == "transfer-encoding"
            for c in value.split(",")
        ]  # fmt: skip
        if self._is_head_request or status in _BODILESS_STATUSES:
            self._state = "done"
        elif codings:  # chunked, or a body that ends with the connection
            self._state = "size" if codings[-1] == "chunked" else "done"
        elif len(lengths) == 1 and (length := lengths.pop()).isdigit() and len(length) <= 18:
            self._state, self._length = "length", int(length)
            self._take_length(len(self._pending))
            self._pending = b""
        else:  # no length: the body ends with the connection (or the length cannot be read)
            self._state = "done" if not lengths else "unknown"

    def _read_size(self, line: bytes) -> None:
        size_text = line.split(b";", 1)[0].strip()
        if not size_text or len(size_text) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size_text):
            self._state = "unknown"
        elif (size := int(size_text, 16)) == 0:
            self._state = "trailer"
        else:
            self._state, self._left = "data", size
