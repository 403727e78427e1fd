"""The egress soak played from inside real sandboxes (local and Docker backends): downloads made by
``curl`` in the sandbox, 8 at once, through snapgym's egress proxy, each checked byte for byte.

The origin (tests/support/servers/blob_origin.py) listens on this side of the test internet's veth pair,
``files.test`` in the proxy's hosts map. Inside the sandbox each download is piped into
``sha256sum``; every digest must match what the origin sent, and every audit record
(``sandbox.network_log()``) must count exactly the bytes delivered (the response head and body),
with no error. An origin that ends early (a clean close short of its ``Content-Length``, a chunked
body closed before its last chunk, a reset) is a failed transfer for curl (non-zero exit) and a
``cut: the destination ...`` record counting what curl got.

Default run: 8 downloads of 1-4 MB and the cut cases, per backend (seconds). Slow set: 80
downloads of 20-50 MB per backend, fast and slow origin alternating (about 30 s each on a quiet machine)::

    PYTHONPATH=$PWD python -m pytest -n 0 -q tests/egress/test_egress_soak_sandbox.py -m "slow or not slow"
"""

from __future__ import annotations

import random
import shlex
from collections.abc import Iterator

import pytest

from pool import Backend, Sandbox
from pool.egress import NetworkPolicy, Phase
from pool.network.audit import Connection
from tests.support.backends import WORKSPACE_TEMPLATE, backend_params
from tests.support.fixtures.net_fixtures import TestInternet, egress_options, proxied_backend
from tests.support.servers.blob_origin import MIB, BlobOrigin, head_of, sha256_of

pytest_plugins = ["tests.support.fixtures.net_fixtures"]

HOST = "files.test"
JOB = r"""
i=$1; url=$2
sum=$( { curl -sS -m 300 "$url"; echo $? > /tmp/soak.rc.$i; } | sha256sum | cut -d' ' -f1 )
echo "$i $(cat /tmp/soak.rc.$i) $sum"
"""
"""One download: ``<index> <curl's exit status> <sha256 of what it got>``."""


@pytest.fixture(scope="module")
def origin(internet: TestInternet) -> Iterator[BlobOrigin]:
    server = BlobOrigin(internet.host_address)
    yield server
    server.close()


@pytest.fixture(scope="module", params=backend_params(only=("local", "docker")))
def soak_backend(
    request: pytest.FixtureRequest,
    internet: TestInternet,
    origin: BlobOrigin,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Backend]:
    egress = egress_options(internet, hosts={**internet.hosts, HOST: internet.host_address})
    with proxied_backend(str(request.param), tmp_path_factory.mktemp("store"), egress) as backend:
        yield backend


@pytest.fixture()
def sandbox(soak_backend: Backend) -> Iterator[Sandbox]:
    with soak_backend.create(soak_backend.build(WORKSPACE_TEMPLATE)) as sandbox:
        sandbox.set_network(NetworkPolicy.public(), phase=Phase.AGENT)
        yield sandbox


def url(origin: BlobOrigin, size: int, seed: int, pace: str) -> str:
    return f"http://{HOST}:{origin.port}/{size}/{seed}/{pace}"


def downloads(sandbox: Sandbox, origin: BlobOrigin, jobs: list[tuple[int, int, str]]) -> dict[int, tuple[int, str]]:
    """Run ``jobs`` (size, seed, pace) 8 at once in the sandbox: index -> (curl's exit, sha256)."""
    listing = "".join(f"{i} {url(origin, *job)}\n" for i, job in enumerate(jobs))
    command = f"xargs -P 8 -n 2 sh -c {shlex.quote(JOB)} _"
    done = sandbox.exec(command, stdin=listing, timeout_s=600)
    assert done.exit_code == 0, done.stderr
    results = {}
    for line in done.stdout.splitlines():
        index, status, digest = line.split()
        results[int(index)] = (int(status), digest)
    return results


def records(sandbox: Sandbox) -> list[Connection]:
    return [c for c in sandbox.network_log().connections if c.host == HOST]


def soak(sandbox: Sandbox, origin: BlobOrigin, jobs: list[tuple[int, int, str]]) -> None:
    results = downloads(sandbox, origin, jobs)
    assert sorted(results) == list(range(len(jobs)))
    wrong = [(i, job) for i, job in enumerate(jobs) if results[i] != (0, sha256_of(job[0], job[1]))]
    assert wrong == [], wrong
    log = records(sandbox)
    assert len(log) == len(jobs)
    assert [c.error for c in log if c.error] == []
    delivered = sorted(len(head_of(size, pace)) + size for size, _, pace in jobs)
    assert sorted(c.bytes_down for c in log) == delivered


def test_downloads_at_8_at_once_arrive_whole_and_are_counted_exactly(sandbox: Sandbox, origin: BlobOrigin) -> None:
    rng = random.Random(8)
    soak(sandbox, origin, [(rng.randrange(MIB, 4 * MIB), seed, ("fast", "slow")[seed % 2]) for seed in range(8)])


@pytest.mark.slow
def test_80_large_downloads_at_8_at_once_arrive_whole_and_are_counted_exactly(
    sandbox: Sandbox, origin: BlobOrigin
) -> None:
    rng = random.Random(30)
    jobs = [(rng.randrange(20 * MIB, 50 * MIB), seed, ("fast", "slow")[seed % 2]) for seed in range(80)]
    soak(sandbox, origin, jobs)


@pytest.mark.parametrize(
    ("pace", "error"),
    [
        ("fin", "cut: the destination closed after 2097152 of the 4194304 body bytes it announced"),
        ("chunked", "cut: the destination closed inside its chunked body, before the last chunk"),
        ("reset", "cut: the destination broke the connection"),
        ("unframed-reset", "cut: the destination broke the connection"),
    ],
    ids=["fin", "chunked", "reset", "unframed-reset"],
)
def test_an_origin_that_ends_early_fails_curl_and_is_a_cut_counted_exactly(
    sandbox: Sandbox, origin: BlobOrigin, pace: str, error: str
) -> None:
    got = sandbox.exec(f"curl -sS -m 60 -o /dev/null -w '%{{size_download}}' {url(origin, 4 * MIB, 9, pace)}")
    assert got.exit_code != 0, (pace, got)  # a failed transfer, never a short one that looks whole
    (record,) = records(sandbox)
    assert record.error is not None and record.error.startswith(error), record
    if pace != "chunked":  # curl counts a chunked body without its framing
        assert record.bytes_down == len(head_of(4 * MIB, pace)) + int(got.stdout), (got, record)
