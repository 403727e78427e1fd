"""The body of a plain HTTP request, forwarded exactly as far as its head says it goes.

The proxy forwards one request per connection. Bytes after the body would be a
second request on the same connection to the same server, never checked
against the policy (a different ``Host``, for one), so they are not forwarded;
and a head whose framing two servers could read differently (both
``Content-Length`` and ``Transfer-Encoding``, or conflicting lengths: request
smuggling) is refused before anything is sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from pool.egress.connection.head import RequestHead
from pool.egress.connection.relay import CHUNK_BYTES, Activity, send

_MAX_CHUNK_LINE = 4096


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
