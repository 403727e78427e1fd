"""Soak: hundreds of large downloads through the proxy at 8 at once, each checked byte for byte;
and an origin that breaks off is a failed transfer for the client, and a cut in the record.

Issue 30 saw one download in ~40 cut short (curl ``(56) unexpected eof``) while the audit said it
was whole. Here 160 downloads of 20-50 MB from a fast origin and a slow one (it writes in small
pieces with pauses), through one gate, 8 at a time, by clients that read at their own pace: every
body's sha256 matches what the origin sent, and every audit record counts exactly the bytes its
client received, with no error. A client that hangs up halfway is recorded as cut.

An origin that ends early (a reset; a clean close short of its ``Content-Length`` or inside a
chunked body; a reset of a body that had no length) makes the proxy reset the client's connection
once what was sent reached it: the client sees a failed transfer, never an end it could take for
the end of a whole one, and the record says ``cut: the destination ...`` and counts exactly what
the client got. The sandbox side of all this is tests/egress/test_egress_soak_sandbox.py.

Default run: the cut cases (small, a second). Slow set (the 160 downloads, ~1 min):
``PYTHONPATH=$PWD python -m pytest -n 0 -q tests/egress/test_egress_soak.py -m "slow or not slow"``.
"""

from __future__ import annotations

import hashlib
import random
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from pool.egress.limits import ProxyLimits
from pool.egress.proxy import EgressProxy
from pool.egress.settings import EgressSettings
from pool.network.audit import Connection
from pool.network.policy import NetworkPolicy, Phase
from tests.support.servers.blob_origin import MIB, BlobOrigin, body_of

ORIGIN = "127.0.0.7"
SETTINGS = EgressSettings(hosts={"files.test": ORIGIN}, trusted_networks=("127.0.0.0/8",), connect_timeout_s=5)


@pytest.fixture(scope="module")
def origin() -> Iterator[BlobOrigin]:
    server = BlobOrigin(ORIGIN)
    yield server
    server.close()


def download(port: int, origin: BlobOrigin, size: int, seed: int, pace: str, *, hang_up_at: int | None = None) -> bytes:
    """The response a client got (it reads 64 KiB at a time; ``hang_up_at``: it closes then)."""
    return fetch(port, origin, size, seed, pace, hang_up_at=hang_up_at)[0]


def fetch(
    port: int, origin: BlobOrigin, size: int, seed: int, pace: str, *, hang_up_at: int | None = None
) -> tuple[bytes, bool]:
    """The response a client got, and whether its connection ended with a reset (a failed transfer)."""
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
            return bytes(got), True
    return bytes(got), False


def drain_all(gate: object, count: int) -> list[Connection]:
    found: list[Connection] = []
    deadline = time.monotonic() + 60
    while len(found) < count and time.monotonic() < deadline:
        found += gate.drain()[0]  # type: ignore[attr-defined]
        time.sleep(0.05)
    return found


@pytest.mark.slow
def test_160_large_downloads_at_8_at_once_arrive_whole_and_are_counted_exactly(origin: BlobOrigin) -> None:
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


@pytest.mark.slow
def test_an_origin_that_breaks_off_is_a_failed_transfer_and_recorded_as_cut(origin: BlobOrigin) -> None:
    with EgressProxy(SETTINGS, limits=ProxyLimits(idle_timeout_s=30)) as proxy:
        listener = socket.create_server(("127.0.0.1", 0))
        gate = proxy.open_gate(listener, NetworkPolicy.parse("public"), Phase.VERIFIER)
        got = download(listener.getsockname()[1], origin, 40 * MIB, 7, "reset")
        (record,) = drain_all(gate, 1)
    assert len(got.partition(b"\r\n\r\n")[2]) < 40 * MIB  # the client sees fewer bytes than announced
    assert record.error is not None and record.error.startswith("cut: the destination broke"), record
    assert record.bytes_down <= len(got) + (256 << 10), (len(got), record)


@pytest.mark.slow
def test_a_client_that_hangs_up_halfway_is_counted_for_what_it_took(origin: BlobOrigin) -> None:
    with EgressProxy(SETTINGS, limits=ProxyLimits(idle_timeout_s=30)) as proxy:
        listener = socket.create_server(("127.0.0.1", 0))
        gate = proxy.open_gate(listener, NetworkPolicy.parse("public"), Phase.VERIFIER)
        got = download(listener.getsockname()[1], origin, 40 * MIB, 7, "slow", hang_up_at=10 * MIB)
        (record,) = drain_all(gate, 1)
    assert len(got) <= record.bytes_down < 40 * MIB, (len(got), record)


@pytest.mark.parametrize(
    ("pace", "error"),
    [
        ("reset", "cut: the destination broke the connection"),
        ("fin", "cut: the destination closed after 2097152 of the 4194304 body bytes it announced"),
        ("chunked", "cut: the destination closed inside its chunked body, before the last chunk"),
        ("unframed-reset", "cut: the destination broke the connection"),
    ],
    ids=["reset", "fin", "chunked", "unframed-reset"],
)
def test_an_origin_that_ends_early_is_a_reset_for_the_client_and_a_cut_counted_exactly(
    origin: BlobOrigin, pace: str, error: str
) -> None:
    with EgressProxy(SETTINGS, limits=ProxyLimits(idle_timeout_s=30)) as proxy:
        listener = socket.create_server(("127.0.0.1", 0))
        gate = proxy.open_gate(listener, NetworkPolicy.parse("public"), Phase.VERIFIER)
        got, was_reset = fetch(listener.getsockname()[1], origin, 4 * MIB, 3, pace)
        (record,) = drain_all(gate, 1)
    # a clean end after a body with no length would look whole: the client must see a reset
    assert was_reset, (pace, len(got))
    assert record.error is not None and record.error.startswith(error), record
    assert record.bytes_down == len(got), (len(got), record)  # what reached the client, no more
    assert 0 < len(got) < 4 * MIB  # (a reset also drops what the origin had not sent yet)


def test_a_body_that_ends_with_the_connection_is_whole_at_a_clean_close(origin: BlobOrigin) -> None:
    with EgressProxy(SETTINGS, limits=ProxyLimits(idle_timeout_s=30)) as proxy:
        listener = socket.create_server(("127.0.0.1", 0))
        gate = proxy.open_gate(listener, NetworkPolicy.parse("public"), Phase.VERIFIER)
        got, was_reset = fetch(listener.getsockname()[1], origin, 3 * MIB, 5, "fast")
        (record,) = drain_all(gate, 1)
    body = got.partition(b"\r\n\r\n")[2]
    assert not was_reset and hashlib.sha256(body).digest() == hashlib.sha256(body_of(3 * MIB, 5)).digest()
    assert record.error is None and record.bytes_down == len(got), record
