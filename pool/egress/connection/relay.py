"""Moving bytes between a client and a destination, and ending connections cleanly.

Every wait here is bounded: a peer that stops reading or writing holds a
connection for at most the idle timeout, and a refusal is written within the
reply timeout, so a hostile client cannot pin the proxy's resources.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import termios
from collections.abc import Callable, Coroutine
from typing import Any

CHUNK_BYTES = 64 * 1024
_LINGER_BYTES = 64 * 1024
_STALL_S = 0.5
"""A peer that took none of what is queued for it for this long is not reading."""
_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


class SourceBrokenError(OSError):
    """The side a pipe copies from broke off mid-transfer: it reset the connection, or ended before
    the end its own framing announced (``str()``: what it did, as in "closed after ...")."""


class Activity:
    """When bytes last moved on a connection, for the idle timeout."""

    def __init__(self) -> None:
        self.last = asyncio.get_running_loop().time()

    def touch(self) -> None:
        """Bytes moved now."""
        self.last = asyncio.get_running_loop().time()

    async def idle(self, timeout_s: float) -> None:
        """Return once nothing moved for ``timeout_s``."""
        loop = asyncio.get_running_loop()
        while (left := self.last + timeout_s - loop.time()) > 0:
            await asyncio.sleep(left)


async def send(writer: asyncio.StreamWriter, data: bytes, activity: Activity | None = None) -> None:
    """Write ``data`` and wait until the transport took it (the peer reads, or the idle timeout cuts)."""
    writer.write(data)
    await writer.drain()
    if activity is not None:
        activity.touch()


async def pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    count: Callable[[int], None],
    activity: Activity,
    watch: Callable[[bytes], None] | None = None,
) -> None:
    """Copy ``reader`` to ``writer`` until end of stream, counting the bytes (and showing each
    piece to ``watch`` before it is sent).

    Raises:
        SourceBrokenError: reading failed (the source reset the connection); a failure to write
            is the plain OSError (the destination went away).
    """
    while True:
        try:
            data = await reader.read(CHUNK_BYTES)
        except OSError as exc:
            raise SourceBrokenError(f"broke the connection ({(exc.strerror or 'reset').lower()})") from exc
        if not data:
            return
        activity.touch()
        if watch is not None:
            watch(data)
        await send(writer, data, activity)
        count(len(data))


async def relay(
    up: Coroutine[Any, Any, bool],
    down: Coroutine[Any, Any, None],
    activity: Activity,
    idle_timeout_s: float,
) -> str | None:
    """Run both directions of a connection until it is over.

    It is over when ``down`` (destination to client) ends or fails, when ``up`` fails or returns
    False (its check refused the client, or its request is done and the destination will close),
    or after ``idle_timeout_s`` without traffic. ``up`` returning True (the client half-closed)
    leaves ``down`` running: the destination may still answer.

    Returns:
        ``"idle timeout"`` when that ended it, ``"cut: ..."`` when the destination broke its side
        mid-transfer (``down`` raised :class:`SourceBrokenError`: a reset, or an answer that ended
        short), else None (a client that hangs up early chose to).
    """
    up_task, down_task = asyncio.ensure_future(up), asyncio.ensure_future(down)
    idle_task = asyncio.ensure_future(activity.idle(idle_timeout_s))
    pending: set[asyncio.Future[Any]] = {up_task, down_task, idle_task}
    try:
        while True:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if idle_task in done:
                return "idle timeout"
            if down_task in done or (up_task in done and (up_task.exception() or not up_task.result())):
                break
    finally:
        for task in (up_task, down_task, idle_task):
            task.cancel()
        await asyncio.gather(up_task, down_task, idle_task, return_exceptions=True)
    for task in (up_task, down_task):
        failure = None if task.cancelled() else task.exception()
        if failure is not None and not isinstance(failure, OSError):
            raise failure  # a bug here, not a peer that went away
    broken = None if down_task.cancelled() else down_task.exception()
    if isinstance(broken, SourceBrokenError):
        return f"cut: the destination {broken}"
    return None


async def reply(writer: asyncio.StreamWriter, status: int, body: str, timeout_s: float) -> None:
    """Answer ``status`` with a one-line text body, giving up after ``timeout_s``."""
    payload = (body + "\n").encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(timeout_s):
            await send(writer, head.encode() + payload)


async def shut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, linger_s: float) -> None:
    """Close a client connection so that what was written reaches it.

    Closing with unread bytes in the socket makes the kernel send a reset, which can destroy
    a response the client has not read yet; so the proxy half-closes, reads and discards what
    the client still sends (a bounded amount, for a bounded time), then closes.
    """
    try:
        if writer.transport.get_write_buffer_size() == 0 and writer.can_write_eof():
            writer.write_eof()
            async with asyncio.timeout(linger_s):
                discarded = 0
                while discarded < _LINGER_BYTES and (data := await reader.read(CHUNK_BYTES)):
                    discarded += len(data)
    except (OSError, TimeoutError):
        pass
    finally:
        close(writer)


async def flush(writer: asyncio.StreamWriter, timeout_s: float) -> None:
    """Wait, at most ``timeout_s``, until the proxy's own buffer for a peer is empty.

    ``drain`` returns once the buffer is below its high-water mark, so a transfer whose other
    side ended may still have its last bytes here; closing then would reset the connection and
    drop them (a download that looks whole to the audit and is cut for the client).
    """
    transport = writer.transport
    if transport.is_closing() or transport.get_write_buffer_size() == 0:
        return
    transport.set_write_buffer_limits(high=0)  # drain now waits for the buffer to be empty
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(timeout_s):
            await writer.drain()


async def deliver(writer: asyncio.StreamWriter, timeout_s: float) -> None:
    """Wait, at most ``timeout_s``, until the peer has every byte written to it (the proxy's buffer
    and the kernel's send queue are empty), giving up sooner once it took nothing for a while."""
    loop = asyncio.get_running_loop()
    deadline, left = loop.time() + timeout_s, unsent(writer)
    last_progress = loop.time()
    while left > 0 and loop.time() < deadline and loop.time() - last_progress < _STALL_S:
        await asyncio.sleep(0.01)
        if (now_left := unsent(writer)) < left:
            last_progress = loop.time()
        left = now_left


def unsent(writer: asyncio.StreamWriter) -> int:
    """What is written to the peer and not yet acknowledged by it: the proxy's buffer and the
    kernel's send queue (unsent or unacknowledged bytes)."""
    transport = writer.transport
    sock = transport.get_extra_info("socket")
    queued = 0
    if sock is not None and not transport.is_closing():
        with contextlib.suppress(OSError, ValueError):
            queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    return transport.get_write_buffer_size() + queued


def lost_on_close(writer: asyncio.StreamWriter) -> int:
    """The bytes a :func:`close` now would drop: none when it closes gracefully, else what is
    still in the proxy's buffer and in the kernel's send queue (unsent or unacknowledged)."""
    return 0 if writer.transport.get_write_buffer_size() == 0 else unsent(writer)


def close(writer: asyncio.StreamWriter) -> None:
    """Close now: gracefully when nothing is left to send, else with a reset (a peer that stopped
    reading must not keep the socket open)."""
    if writer.transport.get_write_buffer_size() > 0:
        reset(writer)
    else:
        writer.transport.close()


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (what is still queued is dropped): the peer sees a failed connection,
    never an end of stream it could take for the end of a whole transfer."""
    transport = writer.transport
    if transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, ValueError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
