"""The proxy delivers a download whole or says it did not: never a short one that looks whole.

Once in ~40 large downloads through the proxy, curl saw ``(56) unexpected eof`` while the audit
recorded the connection as allowed, error-free, with the full byte count: when the origin had
sent its last bytes and closed, the proxy closed the client's connection with bytes still in its
own send buffer (a slow reader), which resets the connection and drops them. Here a client that
reads slowly gets every byte (checked by sha256) and the record counts what was delivered; a
client that stops reading is cut, and its record says so and counts only what it took.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Iterator

import pytest

from pool.egress.gate import Gate
from pool.egress.limits import ProxyLimits
from pool.egress.proxy import EgressProxy
from pool.egress.settings import EgressSettings
from pool.network.audit import Connection
from pool.network.policy import NetworkPolicy, Phase
from tests.support.servers.tcp_server import TcpServer, read_head

BLOB = "127.0.0.6"
SIZE = 8 << 20
PAYLOAD = os.urandom(SIZE)
SETTINGS = EgressSettings(hosts={"blob.test": BLOB}, trusted_networks=("127.0.0.0/8",), connect_timeout_s=2)


def _answer(conn: socket.socket) -> None:
    """An origin's answer to any request: PAYLOAD at full speed, then it closes at once."""
    with conn:
        read_head(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % SIZE + PAYLOAD)


@pytest.fixture(scope="module")
def blob() -> Iterator[TcpServer]:
    server = TcpServer(BLOB, _answer)
    yield server
    server.close()


def _gate(proxy: EgressProxy) -> tuple[Gate, int]:
    listener = socket.create_server(("127.0.0.1", 0))
    return proxy.open_gate(listener, NetworkPolicy.parse("public"), Phase.VERIFIER), listener.getsockname()[1]


def _slow_client(port: int, blob: TcpServer, *, pace_s: float = 0.002, stop_after: int | None = None) -> bytes:
    """GET the blob through the proxy with a small receive buffer, reading 16 KiB per ``pace_s``; with
    ``stop_after``, stop reading (but keep the connection) once that many bytes came."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET http://blob.test:{blob.port}/blob HTTP/1.1\r\nHost: blob.test:{blob.port}\r\n\r\n".encode())
    got = b""
    with sock:
        try:
            while chunk := sock.recv(16 << 10):
                got += chunk
                if stop_after is not None and len(got) >= stop_after:
                    time.sleep(4)  # past the proxy's idle timeout, still connected
                    return got
                time.sleep(pace_s)
        except ConnectionResetError:
            pass
    return got


def _record(gate: Gate) -> Connection:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = gate.drain()[0]
        if found:
            return found[0]
        time.sleep(0.02)
    raise AssertionError("no record")


@pytest.mark.parametrize("pace_s", [0.0005, 0.004])
def test_a_slow_reader_gets_every_byte_and_the_record_counts_them(blob: TcpServer, pace_s: float) -> None:
    with EgressProxy(SETTINGS, limits=ProxyLimits(idle_timeout_s=10)) as proxy:
        gate, port = _gate(proxy)
        for _ in range(3):
            got = _slow_client(port, blob, pace_s=pace_s)
            body = got.partition(b"\r\n\r\n")[2]
            assert len(body) == SIZE and hashlib.sha256(body).digest() == hashlib.sha256(PAYLOAD).digest()
            record = _record(gate)
            assert record.error is None and record.bytes_down == len(got), record


def test_a_reader_that_stops_is_cut_and_its_record_says_so(blob: TcpServer) -> None:
    with EgressProxy(SETTINGS, limits=ProxyLimits(idle_timeout_s=1)) as proxy:
        gate, port = _gate(proxy)
        got = _slow_client(port, blob, stop_after=1 << 20)
        record = _record(gate)
        assert record.error is not None and "never reached the client" in record.error, record
        # about what reached the client (what it read, give or take its receive buffer and the acks
        # in flight), not all the proxy wrote into its own buffers and the kernel's (megabytes more)
        assert abs(record.bytes_down - len(got)) <= 256 << 10, (len(got), record)
