"""A template's build reaches the network only as its build policy allows, through snapgym's egress
proxy, and the snapshot records what it reached. Attacks first: a Dockerfile (or a poisoned task)
whose build wants the host's services, the cloud's metadata, a host the policy does not list, or to
leave the build's proxy settings behind in the start state.

The "internet" is net_fixtures' namespace of origin servers; the proxy's resolver maps the test
names to it.
"""

from __future__ import annotations

import socket
import textwrap
import threading
import uuid
from collections.abc import Iterator

import pytest

from pool import Backend, BuildError, Template
from pool.build.network import BuildRoute, build_route
from pool.egress import NetworkPolicy
from pool.errors import UnsupportedError
from tests.support.backends import backend_params
from tests.support.fixtures.net_fixtures import TestInternet, egress_options, proxied_backend

pytest_plugins = ["tests.support.fixtures.net_fixtures"]

CURL = "curl -sS -m 10 -o /dev/null -w '%{http_code}'"


@pytest.fixture(scope="module", params=backend_params())
def build_backend(
    request: pytest.FixtureRequest, internet: TestInternet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backend]:
    with proxied_backend(str(request.param), tmp_path_factory.mktemp("store"), egress_options(internet)) as backend:
        yield backend


@pytest.fixture()
def host_service() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP service on this machine's loopback (a database, the Ray dashboard): its port and what it got."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    received: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                received.append(conn.recv(1000))
                conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nsecret\n")

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], received
    server.close()


RUN = uuid.uuid4().hex[:8]
"""Part of every template name: a build of an earlier test run (a Docker engine keeps its snapshot images)
is never a cache hit that would skip the build this module watches."""


def _name(request: pytest.FixtureRequest) -> str:
    return f"build-net-{request.node.name}-{RUN}"


# -- what the build may reach ------------------------------------------------------------------


def test_a_public_build_downloads_through_the_proxy_and_the_snapshot_records_it(
    build_backend: Backend, internet: TestInternet, request: pytest.FixtureRequest
) -> None:
    template = Template(
        name=_name(request),
        setup=[f"{CURL} https://pypi.org/_echo > /fetched", f"{CURL} http://other.test/_echo >> /fetched"],
        network=True,
    )
    snapshot = build_backend.build(template)
    record = snapshot.build_network
    assert record["policy"] == {"network_mode": "public", "allowed_hosts": []} and record["route"] == "proxy"
    assert record["audit"]["allowed"] == 2 and record["audit"]["hosts"]["allowed"] == ["pypi.org:443", "other.test:80"]
    assert internet.requests("pypi.org") and internet.requests("other.test")
    with build_backend.create(snapshot) as sandbox:
        assert sandbox.read_file("/fetched") == b"200200"
        # the start state keeps nothing of the build's network: no CA bundle, no proxy variables, no route
        assert not sandbox.exec("test -e /etc/snapgym").ok
        assert sandbox.exec("env | grep -i _proxy").stdout == ""
        assert sandbox.exec(f"{CURL} https://pypi.org/_echo").exit_code != 0
        assert sandbox.network_log().connections == ()


def test_an_allowlist_build_refuses_other_hosts_and_the_error_names_them(
    build_backend: Backend, internet: TestInternet, request: pytest.FixtureRequest
) -> None:
    template = Template(
        name=_name(request),
        setup=[f"{CURL} https://pypi.org/_echo", "curl -fsS -m 10 https://example.com/_echo"],
        network=NetworkPolicy.allowlist(["pypi.org"]),
    )
    with pytest.raises(BuildError) as raised:
        build_backend.build(template)
    message = str(raised.value)
    assert "setup step 2" in message and "example.com:443 (denied: allowlist:no match)" in message, message
    assert "pypi.org" not in message.split("refused or could not reach")[1]
    assert internet.requests("example.com") == []  # the refused request never reached the origin


def test_a_no_network_build_gets_nothing_and_says_what_it_tried(
    build_backend: Backend, internet: TestInternet, request: pytest.FixtureRequest
) -> None:
    before = len(internet.requests())
    with pytest.raises(BuildError) as raised:
        build_backend.build(Template(name=_name(request), setup=["curl -fsS -m 10 https://pypi.org/simple/"]))
    assert "setup step 1" in str(raised.value)
    assert len(internet.requests()) == before


def test_a_public_build_cannot_reach_this_machine_or_the_cloud_metadata(
    build_backend: Backend, host_service: tuple[int, list[bytes]], request: pytest.FixtureRequest
) -> None:
    """A build that wants the host's services (through the proxy, or around it) or credentials from
    the metadata address gets refusals, on record; 'public' means the internet, not this machine."""
    port, received = host_service
    tries = [
        f"curl -fsS -m 5 http://127.0.0.1:{port}/ --noproxy '' --proxy http://127.0.0.1:3128",
        f"curl -fsS -m 5 http://localhost:{port}/ --noproxy '' --proxy http://127.0.0.1:3128",
        "curl -fsS -m 5 http://169.254.169.254/latest/meta-data/",
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)\"",
    ]
    template = Template(
        name=_name(request), setup=[f'({t}) >> /tries 2>&1; echo "exit $?" >> /tries' for t in tries], network=True
    )
    snapshot = build_backend.build(template)
    assert received == []
    denied = snapshot.build_network["audit"]["hosts"]["denied"]
    assert {f"127.0.0.1:{port}", f"localhost:{port}", "169.254.169.254:80"} <= set(denied), denied
    with build_backend.create(snapshot) as sandbox:
        tried = sandbox.read_file("/tries").decode()
    assert "secret" not in tried and tried.count("exit 0") == 0, tried


def test_a_build_gets_no_raw_route_whatever_its_policy(
    build_backend: Backend, internet: TestInternet, request: pytest.FixtureRequest
) -> None:
    address = internet.hosts["pypi.org"]
    script = textwrap.dedent(f"""
        import socket
        for what, call in [
            ("tcp", lambda: socket.create_connection(("{address}", 443), timeout=3)),
            ("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"q", ("{address}", 53))),
            ("dns", lambda: socket.getaddrinfo("pypi.org", 443)),
        ]:
            try:
                call()
                print(what, "REACHED")
            except OSError:
                print(what, "blocked")
    """)
    template = Template(name=_name(request), setup=[f"python3 - > /out <<'EOF'\n{script}EOF"], network=True)
    snapshot = build_backend.build(template)
    with build_backend.create(snapshot) as sandbox:
        out = sandbox.read_file("/out").decode()
    assert "REACHED" not in out and out.count("blocked") == 3, out
    assert internet.udp_datagrams() == []
    assert snapshot.build_network["route"] == "proxy"


def test_the_build_policy_is_part_of_the_snapshots_identity(
    build_backend: Backend, request: pytest.FixtureRequest
) -> None:
    """The same steps under another build policy are another snapshot (the policy can change the result)."""
    steps = ["echo built > /state"]
    ids = {
        build_backend.build(Template(name=_name(request), setup=steps, network=policy)).id
        for policy in (False, True, NetworkPolicy.allowlist(["pypi.org"]))
    }
    assert len(ids) == 3


# -- where the proxy cannot serve a build ------------------------------------------------------


def test_without_the_proxy_only_public_falls_back_and_an_allowlist_is_refused() -> None:
    """A backend without the proxy (rootless) may give a public build its own network, unfiltered
    and said so in the record; an allowlist it cannot enforce is refused, not silently widened."""
    public = build_route(NetworkPolicy.public(), proxy_available=False, why_not="rootless", backend="local")
    assert public is BuildRoute.DIRECT
    assert build_route(NetworkPolicy.offline(), proxy_available=False, why_not="", backend="local") is BuildRoute.NONE
    with pytest.raises(UnsupportedError, match=r"allowlist.*rootless.*'public' or 'no-network'"):
        build_route(NetworkPolicy.allowlist(["pypi.org"]), proxy_available=False, why_not="rootless", backend="local")


def test_the_capabilities_say_which_build_policies_a_backend_enforces(build_backend: Backend) -> None:
    assert set(build_backend.capabilities.build_network_modes) == {"public", "no-network", "allowlist"}
    assert "build network" in build_backend.capabilities.table_row()
