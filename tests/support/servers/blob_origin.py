"""An origin of large downloads for the egress soak tests: bodies made from a seed, served at a pace,
whole or broken off in the ways an origin breaks off.

``GET /<size>/<seed>/<pace>`` answers :func:`body_of` ``(size, seed)`` with ``Content-Length`` and
``Connection: close``; the pace says how:

- ``fast``: all at once; ``slow``: 64 KiB pieces with 1 ms pauses;
- ``reset``: half the body, then a reset (an origin that crashed);
- ``fin``: half the body, then a clean close (FIN), short of the length it announced;
- ``chunked``: chunked instead of a length, closed cleanly after half the body, before the last chunk;
- ``unframed-reset``: no length (the body ends with the connection), half of it, then a reset.
"""

from __future__ import annotations

import hashlib
import random
import socket
import struct
import time

from tests.support.servers.tcp_server import TcpServer, read_head

MIB = 1 << 20
PIECE = 64 << 10
BLOCK = random.Random(0).randbytes(MIB)
PACES = ("fast", "slow", "reset", "fin", "chunked", "unframed-reset")


def body_of(size: int, seed: int) -> bytes:
    """``size`` bytes that differ per seed (a rotation of one random MiB, repeated)."""
    shift = seed % MIB
    rotated = BLOCK[shift:] + BLOCK[:shift]
    return (rotated * (size // MIB + 1))[:size]


def sha256_of(size: int, seed: int) -> str:
    """The hex sha256 of :func:`body_of` ``(size, seed)``."""
    return hashlib.sha256(body_of(size, seed)).hexdigest()


def head_of(size: int, pace: str) -> bytes:
    """The response head the origin sends for a body of ``size`` at ``pace``."""
    if pace == "chunked":
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    if pace == "unframed-reset":
        return b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size


class BlobOrigin:
    """The origin, listening on ``(host, a free port)`` until :meth:`close`."""

    def __init__(self, host: str) -> None:
        self.server = TcpServer(host, self._answer)
        self.port = self.server.port

    def close(self) -> None:
        """Stop accepting."""
        self.server.close()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            head = read_head(conn)
            try:
                _, size, seed, pace = head.split(b" ")[1].decode().split("/")
            except ValueError:
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            body = body_of(int(size), int(seed))
            try:
                conn.sendall(head_of(len(body), pace))
                _send(conn, body, pace)
            except OSError:
                pass


def _send(conn: socket.socket, body: bytes, pace: str) -> None:
    half = body[: len(body) // 2]
    if pace == "fast":
        conn.sendall(body)
    elif pace == "slow":
        for offset in range(0, len(body), PIECE):
            conn.sendall(body[offset : offset + PIECE])
            time.sleep(0.001)
    elif pace in ("reset", "unframed-reset"):
        conn.sendall(half)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    elif pace == "fin":
        conn.sendall(half)
        conn.shutdown(socket.SHUT_WR)
    elif pace == "chunked":
        for offset in range(0, len(half), PIECE):
            piece = half[offset : offset + PIECE]
            conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        conn.shutdown(socket.SHUT_WR)  # no "0\r\n\r\n": the body is not over
