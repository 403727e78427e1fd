"""Byte streams the cache speaks HTTP over: a plain connection, or TLS run by the proxy itself.

TLS runs over memory buffers (:class:`ssl.SSLObject`) rather than asyncio's ``start_tls``
because the proxy has already read the client's first bytes (the ClientHello it checked
against the CONNECT host) and must hand those to the TLS layer. Every read and write is
bounded by a timeout, and every byte on the wire is counted for the audit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
from collections.abc import Callable
from typing import Protocol, TypeVar

from pool.egress.connection.relay import CHUNK_BYTES

_T = TypeVar("_T")


class Stream(Protocol):
    """What HTTP is read from and written to."""

    async def read(self) -> bytes:
        """The next bytes; empty at the end of the stream."""
        ...

    async def write(self, data: bytes) -> None:
        """Send ``data``."""
        ...

    @property
    def is_truncated(self) -> bool:
        """Whether the stream ended without the peer saying so (TLS without close_notify)."""
        ...


class PlainStream:
    """A TCP connection, with bytes already read from it put back in front."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        count: Callable[[int], None],
        timeout_s: float,
        initial: bytes = b"",
    ) -> None:
        self._reader, self._writer = reader, writer
        self._count = count
        self._timeout_s = timeout_s
        self._pending = initial

    @property
    def is_truncated(self) -> bool:
        """Plain TCP cannot tell; never."""
        return False

    async def read(self) -> bytes:
        """The next bytes; empty at the end."""
        if self._pending:
            data, self._pending = self._pending, b""
            return data
        async with asyncio.timeout(self._timeout_s):
            return await self._reader.read(CHUNK_BYTES)

    async def write(self, data: bytes) -> None:
        """Send ``data``."""
        async with asyncio.timeout(self._timeout_s):
            self._writer.write(data)
            await self._writer.drain()
        self._count(len(data))

    def write_nowait(self, data: bytes) -> None:
        """Queue ``data`` without waiting for the peer to take it (last words before a close)."""
        if not self._writer.is_closing():
            self._writer.write(data)
            self._count(len(data))


class TLSStream:
    """TLS over a TCP connection, as client or server, driven through memory buffers.

    Args:
        initial: bytes of the peer's already read from ``reader`` (a ClientHello).
        server_hostname: as a client, the name to send and verify.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        context: ssl.SSLContext,
        count: Callable[[int], None],
        timeout_s: float,
        *,
        server_side: bool,
        server_hostname: str | None = None,
        initial: bytes = b"",
    ) -> None:
        self._plain = PlainStream(reader, writer, count, timeout_s, initial)
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._incoming, self._outgoing, server_side=server_side, server_hostname=server_hostname
        )
        self._truncated = False

    @property
    def is_truncated(self) -> bool:
        """Whether the peer ended the connection without a TLS close_notify."""
        return self._truncated

    async def handshake(self) -> None:
        """Complete the TLS handshake.

        Raises:
            ssl.SSLError: it failed (an untrusted certificate, a protocol error); the alert is sent.
        """
        await self._drive(self._tls.do_handshake)

    async def read(self) -> bytes:
        """The next decrypted bytes; empty at the end."""
        try:
            return await self._drive(lambda: self._tls.read(CHUNK_BYTES))
        except ssl.SSLZeroReturnError:
            return b""
        except ssl.SSLEOFError:
            self._truncated = True
            return b""

    async def write(self, data: bytes) -> None:
        """Encrypt and send ``data``."""
        view = memoryview(data)
        while view:
            sent = await self._drive(functools.partial(self._tls.write, view))
            view = view[sent:]

    def close(self) -> None:
        """Queue close_notify without waiting (the peer may be gone, or not reading; a cut must not wait)."""
        with contextlib.suppress(ssl.SSLError):
            self._tls.unwrap()
        if data := self._outgoing.read():
            with contextlib.suppress(OSError):
                self._plain.write_nowait(data)

    async def _drive(self, step: Callable[[], _T]) -> _T:
        while True:
            try:
                result = step()
            except ssl.SSLWantReadError:
                await self._flush()
                if data := await self._plain.read():
                    self._incoming.write(data)
                else:
                    self._incoming.write_eof()
                continue
            except ssl.SSLError:
                with contextlib.suppress(OSError, TimeoutError):
                    await self._flush()  # the alert, so the peer learns why
                raise
            await self._flush()
            return result

    async def _flush(self) -> None:
        if data := self._outgoing.read():
            await self._plain.write(data)
