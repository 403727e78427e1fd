"""The server name a TLS client asks for, read from its ClientHello.

The egress proxy reads it from the first bytes a client sends through a CONNECT
tunnel, so that a tunnel opened to an allowed host cannot carry TLS meant for
another one. Every byte comes from a hostile client: each length is checked
before it is used, a ClientHello split over several records is reassembled, and
the only exception raised is :class:`ValueError` (:class:`Truncated` when more
bytes could still make the ClientHello whole).
"""

from __future__ import annotations

MAX_HELLO_BYTES = 64 * 1024
"""The largest ClientHello read (real ones are under 2 KiB; post-quantum key shares included)."""

MAX_HELLO_RECORDS = 8
"""The most records a ClientHello may span: clients send one; splitting it into many is a known
trick to slip a server name past inspection."""

_HANDSHAKE = 22
_CLIENT_HELLO = 1
_SERVER_NAME = 0
_HOST_NAME = 0
_MAX_RECORD = 2**14
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class Truncated(ValueError):
    """The bytes so far are the start of a TLS handshake; more are needed."""


def is_tls_handshake(data: bytes) -> bool:
    """Whether ``data`` begins like a TLS handshake record (content type 22, version 3.x)."""
    return len(data) >= 3 and data[0] == _HANDSHAKE and data[1] == 3 and data[2] <= 4


def server_name(data: bytes) -> str | None:
    """The SNI host name in the ClientHello at the start of ``data``.

    Args:
        data: the first bytes a client sent; they may continue past the ClientHello.

    Returns:
        The name as the client sent it, or None for a ClientHello without SNI.

    Raises:
        Truncated: ``data`` ends before the ClientHello does.
        ValueError: ``data`` is not a well-formed ClientHello.
    """
    body = _Cursor(client_hello(data))
    body.take(2 + 32)  # legacy_version, random
    body.take(body.u8())  # session id
    body.take(body.u16())  # cipher suites
    body.take(body.u8())  # compression methods
    if body.done():
        return None  # no extensions at all
    extensions = _Cursor(body.take(body.u16()))
    body.end()
    name: str | None = None
    seen: set[int] = set()
    while not extensions.done():
        kind, content = extensions.u16(), extensions.take(extensions.u16())
        if kind in seen:
            raise ValueError(f"ClientHello repeats extension {kind}")
        seen.add(kind)
        if kind == _SERVER_NAME:
            name = _host_name(_Cursor(content))
    return name


def client_hello(data: bytes) -> bytes:
    """The body of the ClientHello handshake message at the start of ``data``, reassembled
    from as many records as it spans.

    Raises:
        Truncated: ``data`` ends before the message does.
        ValueError: the records or the message header are not a ClientHello's.
    """
    message = bytearray()
    position = 0
    for _ in range(MAX_HELLO_RECORDS):
        if len(data) < position + 5:
            raise Truncated("TLS record header incomplete")
        if not is_tls_handshake(data[position : position + 3]):
            raise ValueError("not a TLS handshake record")
        length = int.from_bytes(data[position + 3 : position + 5], "big")
        if not 0 < length <= _MAX_RECORD:
            raise ValueError(f"TLS record length {length} out of range")
        message += data[position + 5 : position + 5 + length]
        position += 5 + length
        if len(message) >= 4:
            if message[0] != _CLIENT_HELLO:
                raise ValueError(f"TLS handshake message {message[0]} is not a ClientHello")
            size = int.from_bytes(message[1:4], "big")
            if size > MAX_HELLO_BYTES:
                raise ValueError(f"ClientHello of {size} bytes is too large")
            if len(message) >= 4 + size:
                return bytes(message[4 : 4 + size])
        if len(data) < position:
            raise Truncated("TLS record incomplete")
    raise ValueError(f"ClientHello split over more than {MAX_HELLO_RECORDS} records")


def _host_name(extension: _Cursor) -> str:
    names = _Cursor(extension.take(extension.u16()))
    extension.end()
    found: str | None = None
    while not names.done():
        kind, value = names.u8(), names.take(names.u16())
        if kind != _HOST_NAME:
            continue
        if found is not None:
            raise ValueError("ClientHello names two hosts")
        found = _checked_name(value)
    if found is None:
        raise ValueError("ClientHello's server_name extension has no host name")
    return found


def _checked_name(value: bytes) -> str:
    # Only hostname characters: the name ends up in audit records and refusal messages.
    text = value.decode("ascii", errors="replace")
    if not 0 < len(text) <= 255 or not set(text) <= _NAME_CHARS:
        raise ValueError("ClientHello's server name is not a host name")
    return text


class _Cursor:
    """Reads length-prefixed fields; running short is a malformed message, not a short read."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._position = 0

    def take(self, count: int) -> bytes:
        end = self._position + count
        if end > len(self._data):
            raise ValueError("ClientHello field runs past its end")
        chunk = self._data[self._position : end]
        self._position = end
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "big")

    def done(self) -> bool:
        return self._position >= len(self._data)

    def end(self) -> None:
        if not self.done():
            raise ValueError("ClientHello field has trailing bytes")
