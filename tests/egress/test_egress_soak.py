"""Soak: hundreds of large downloads through the proxy at 8 at once, each checked byte for byte.

Issue 30 saw one download in ~40 cut short (curl ``(56) unexpected eof``) while the audit said it
was whole. Here 160 downloads of 20-50 MB from a fast origin and a slow one (it writes in small
pieces with pauses), through one gate, 8 at a time, by clients that read at their own pace: every
body's sha256 matches what the origin sent, and every audit record counts exactly the bytes its
client received, with no error. A client that hangs up halfway is recorded as cut. Slow set:
``python -m pytest -m slow -n 0 tests/egress/test_egress_soak.py``.
"""

from __future__ import annotations

import hashlib
import random
import socket
import struct
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from pool.egress.limits import ProxyLimits
from pool.egress.proxy import EgressProxy
from pool.egress.settings import EgressSettings
from pool.network.audit import Connection
from pool.network.policy import NetworkPolicy, Phase
from tests.support.tcp_server import TcpServer, read_head

pytestmark = pytest.mark.slow

ORIGIN = "127.0.0.7"
MIB = 1 << 20
BLOCK = random.Random(0).randbytes(MIB)
SETTINGS = EgressSettings(hosts={"files.test": ORIGIN}, trusted_networks=("127.0.0.0/8",), connect_timeout_s=5)


def body_of(size: int, seed: int) -> bytes:
    """``size`` bytes that differ per download (a rotation of one random MiB, then the seed's bytes)."""
    shift = seed % MIB
    rotated = BLOCK[shift:] + BLOCK[:shift]
    return (rotated * (size // MIB + 1))[:size]


class _Origin:
    """``GET /<size>/<seed>/<pace>``: the body of :func:`body_of`, at full speed, in 64 KiB pieces
    with 1 ms pauses (``slow``), or half of it and then a reset (``reset``)."""

    def __init__(self) -> None:
        self.server = TcpServer(ORIGIN, self._answer)
        self.port = self.server.port

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            head = read_head(conn)
            _, size, seed, pace = head.split(b" ")[1].decode().split("/")
            body = body_of(int(size), int(seed))
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
            try:
                if pace == "fast":
                    conn.sendall(body)
                    return
                if pace == "reset":  # half the body, then a reset (an origin that crashed)
                    conn.sendall(body[: len(body) // 2])
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                for offset in range(0, len(body), 64 << 10):
                    conn.sendall(body[offset : offset + (64 << 10)])
                    time.sleep(0.001)
            except OSError:
                pass


@pytest.fixture(scope="module")
def origin() -> Iterator[_Origin]:
    server = _Origin()
    yield server
    server.server.close()


def download(port: int, origin: _Origin, size: int, seed: int, pace: str, *, hang_up_at: int | None = None) -> bytes:
    """The response body a client got (it reads 64 KiB at a time; ``hang_up_at``: it closes then)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(f"GET http://files.test:{origin.port}/{size}/{seed}/{pace} HTTP/1.1\r\n"
                     f"Host: files.test:{origin.port}\r\n\r\n".encode())  # fmt: skip
        got = bytearray()
        try:
            while chunk := sock.recv(64 << 10):
                got += chunk
                if hang_up_at is not None and len(got) >= hang_up_at:
                    break
        except ConnectionResetError:
            pass
    return bytes(got)


def drain_all(gate: object, count: int) -> list[Connection]:
    found: list[Connection] = []
    deadline = time.monotonic() + 60
    while len(found) < count and time.monotonic() < deadline:
        found += gate.drain()[0]  # type: ignore[attr-defined]
        time.sleep(0.05)
    return found


def test_160_large_downloads_at_8_at_once_arrive_whole_and_are_counted_exactly(origin: _Origin) -> None:
    rng = random.Random(30)
    jobs = [(rng.randrange(20 * MIB, 50 * MIB), seed, "fast" if seed % 2 else "slow") for seed in range(160)]
    with EgressProxy(SETTINGS, limits=ProxyLimits(idle_timeout_s=30, max_connections=64)) as proxy:
        listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        gate = proxy.open_gate(listener, NetworkPolicy.parse("public"), Phase.VERIFIER)
        port = listener.getsockname()[1]

        def one(job: tuple[int, int, str]) -> tuple[int, int]:
            size, seed, pace = job
            got = download(port, origin, size, seed, pace)
            body = got.partition(b"\r\n\r\n")[2]
            assert len(body) == size, (job, len(body))
            assert hashlib.sha256(body).digest() == hashlib.sha256(body_of(size, seed)).digest(), job
            return len(got), seed

        with ThreadPoolExecutor(max_workers=8) as pool:
            received = sorted(pool.map(one, jobs))
        records = drain_all(gate, len(jobs))
    assert len(records) == len(jobs)
    assert [r.error for r in records if r.error] == []
    assert sorted(r.bytes_down for r in records) == sorted(n for n, _ in received)


def test_an_origin_that_breaks_off_is_a_failed_transfer_and_recorded_as_cut(origin: _Origin) -> None:
    with EgressProxy(SETTINGS, limits=ProxyLimits(idle_timeout_s=30)) as proxy:
        listener = socket.create_server(("127.0.0.1", 0))
        gate = proxy.open_gate(listener, NetworkPolicy.parse("public"), Phase.VERIFIER)
        got = download(listener.getsockname()[1], origin, 40 * MIB, 7, "reset")
        (record,) = drain_all(gate, 1)
    assert len(got.partition(b"\r\n\r\n")[2]) < 40 * MIB  # the client sees fewer bytes than announced
    assert record.error is not None and record.error.startswith("cut: the destination broke"), record
    assert record.bytes_down <= len(got) + (256 << 10), (len(got), record)


def test_a_client_that_hangs_up_halfway_is_counted_for_what_it_took(origin: _Origin) -> None:
    with EgressProxy(SETTINGS, limits=ProxyLimits(idle_timeout_s=30)) as proxy:
        listener = socket.create_server(("127.0.0.1", 0))
        gate = proxy.open_gate(listener, NetworkPolicy.parse("public"), Phase.VERIFIER)
        got = download(listener.getsockname()[1], origin, 40 * MIB, 7, "slow", hang_up_at=10 * MIB)
        (record,) = drain_all(gate, 1)
    assert len(got) <= record.bytes_down < 40 * MIB, (len(got), record)
