"""Sandboxes reach the network only through snapgym's egress proxy, as their policy allows, and every
attempt is on record. Attacks first: what an agent that wants out, or wants a forged download, would try.

The "internet" is net_fixtures' namespace of origin servers (HTTP, HTTPS with a test CA, a TCP echo,
a UDP sink, an upstream proxy); the proxy's resolver maps the test names to it.
"""

from __future__ import annotations

import contextlib
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pool import Backend, Sandbox, Snapshot
from pool.egress import NetworkPolicy, Phase
from pool.verification import VerificationPlan, VerifyMode
from tests.support.backends import WORKSPACE_TEMPLATE, backend_params
from tests.support.fixtures.net_fixtures import TestInternet, egress_options, open_backend, proxied_backend, wait_until

pytest_plugins = ["tests.support.fixtures.net_fixtures"]

CURL = "curl -sS -m 10 -o /dev/null -w '%{http_code}'"
"""curl printing only the HTTP status (000 when nothing came back), errors on stderr."""


@contextlib.contextmanager
def fresh_sandbox(name: str, store: Path, egress: dict[str, Any]) -> Iterator[Sandbox]:
    """A sandbox of a backend of its own with these egress settings."""
    with open_backend(name, store, egress) as backend, backend.create(backend.build(WORKSPACE_TEMPLATE)) as sandbox:
        yield sandbox


@pytest.fixture(scope="module", params=backend_params())
def net_backend(
    request: pytest.FixtureRequest, internet: TestInternet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backend]:
    with proxied_backend(str(request.param), tmp_path_factory.mktemp("store"), egress_options(internet)) as backend:
        yield backend


@pytest.fixture(scope="module")
def net_snap(net_backend: Backend) -> Snapshot:
    return net_backend.build(WORKSPACE_TEMPLATE)


@pytest.fixture()
def sandbox(net_backend: Backend, net_snap: Snapshot) -> Iterator[Sandbox]:
    with net_backend.create(net_snap) as sandbox:
        yield sandbox


def verdicts(sandbox: Sandbox) -> list[tuple[str, int, str]]:
    return [(c.host, c.port, c.verdict) for c in sandbox.network_log().connections]


# -- policies ----------------------------------------------------------------------------------


def test_allowlist_lets_listed_hosts_through_and_refuses_the_rest(sandbox: Sandbox, internet: TestInternet) -> None:
    sandbox.set_network(NetworkPolicy.allowlist(["pypi.org"]), phase=Phase.AGENT)
    ok = sandbox.exec(f"{CURL} https://pypi.org/_echo")
    assert ok.stdout == "200", ok.stderr
    refused = sandbox.exec(f"{CURL} https://example.com/_echo")
    assert refused.exit_code != 0 and "403" in refused.stderr
    plain = sandbox.exec("curl -sS -m 10 http://example.com/_echo")
    assert "refused in the agent phase" in plain.stdout and "allowlist:no match" in plain.stdout
    log = sandbox.network_log().connections
    assert [(c.host, c.port, c.verdict, c.rule) for c in log] == [
        ("pypi.org", 443, "allowed", "allowlist:pypi.org"),
        ("example.com", 443, "denied", "allowlist:no match"),
        ("example.com", 80, "denied", "allowlist:no match"),
    ]
    assert log[0].bytes_down > 0 and log[0].sni == "pypi.org" and log[0].phase == "agent"
    assert internet.requests("example.com") == []  # the refused requests never reached the origin


def test_wildcards_match_below_the_name_not_the_name(sandbox: Sandbox) -> None:
    sandbox.set_network(NetworkPolicy.allowlist(["*.example.com"]), phase=Phase.AGENT)
    assert sandbox.exec(f"{CURL} https://api.example.com/_echo").stdout == "200"
    assert sandbox.exec(f"{CURL} https://example.com/_echo").exit_code != 0
    assert verdicts(sandbox) == [("api.example.com", 443, "allowed"), ("example.com", 443, "denied")]


def test_cidr_and_port_rules_match_the_resolved_address(sandbox: Sandbox, internet: TestInternet) -> None:
    other = internet.hosts["other.test"]
    sandbox.set_network(NetworkPolicy.allowlist([f"{other}/32:443"]), phase=Phase.AGENT)
    assert sandbox.exec(f"{CURL} https://other.test/_echo").stdout == "200"
    assert sandbox.exec(f"{CURL} http://other.test/_echo").stdout == "403"  # port 80 is not listed
    assert sandbox.exec(f"{CURL} https://pypi.org/_echo").exit_code != 0  # another address
    assert verdicts(sandbox) == [
        ("other.test", 443, "allowed"), ("other.test", 80, "denied"), ("pypi.org", 443, "denied")
    ]  # fmt: skip


def test_no_network_refuses_everything_and_records_it(sandbox: Sandbox, internet: TestInternet) -> None:
    before = len(internet.requests())
    sandbox.set_network(NetworkPolicy.offline(), phase=Phase.AGENT)
    assert sandbox.exec(f"{CURL} https://pypi.org/_echo").exit_code != 0
    assert sandbox.exec(f"{CURL} http://pypi.org/_echo").stdout == "403"
    assert verdicts(sandbox) == [("pypi.org", 443, "denied"), ("pypi.org", 80, "denied")]
    assert len(internet.requests()) == before


# -- what holds whatever the policy ------------------------------------------------------------


def test_public_still_refuses_private_link_local_loopback_and_ray_ports(
    net_backend: Backend, net_snap: Snapshot, internet: TestInternet, tmp_path: Path
) -> None:
    # names that resolve to a LAN, the cloud metadata service and loopback: DNS rebinding in one line
    hosts = {**internet.hosts, "lan.test": "10.99.0.5", "metadata.test": "169.254.169.254", "self.test": "127.0.0.1"}
    with fresh_sandbox(net_backend.name, tmp_path, egress_options(internet, hosts=hosts)) as sandbox:
        sandbox.set_network(NetworkPolicy.public(), phase=Phase.AGENT)
        for url in ("http://lan.test/", "http://metadata.test/latest/meta-data/", "http://self.test:8265/",
                    "http://127.0.0.1.nip.io/", "http://[::1]/", "http://169.254.169.254/",
                    f"http://{internet.hosts['pypi.org']}:6379/"):  # fmt: skip
            r = sandbox.exec(f"{CURL} --noproxy '' {url}")
            assert r.stdout in ("403", "502"), (url, r.stdout, r.stderr)
        log = sandbox.network_log().connections
    by_host = {c.host: c for c in log}
    assert by_host["lan.test"].verdict == "denied" and "non-global" in by_host["lan.test"].rule
    assert by_host["metadata.test"].verdict == "denied"
    assert by_host["self.test"].verdict == "denied"
    assert by_host["169.254.169.254"].verdict == "denied"
    assert by_host[internet.hosts["pypi.org"]].verdict == "denied"
    assert "6379" in by_host[internet.hosts["pypi.org"]].rule
    assert all(c.verdict != "allowed" for c in log)


def test_sni_that_disagrees_with_the_connect_host_is_refused(sandbox: Sandbox, internet: TestInternet) -> None:
    """Domain fronting: CONNECT to an allowed name, then speak TLS to another one."""
    sandbox.set_network(NetworkPolicy.allowlist(["pypi.org"]), phase=Phase.AGENT)
    before = len(internet.requests())
    script = textwrap.dedent("""
        import socket, ssl, os
        s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
        s.sendall(b"CONNECT pypi.org:443 HTTP/1.1\\r\\nHost: pypi.org:443\\r\\n\\r\\n")
        print(s.recv(4096).split(b"\\r\\n")[0].decode())
        ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
        try:
            t = ctx.wrap_socket(s, server_hostname="example.com")
            t.sendall(b"GET /_echo HTTP/1.1\\r\\nHost: example.com\\r\\n\\r\\n")
            print("GOT", t.recv(100))
        except (OSError, ssl.SSLError) as exc:
            print("REFUSED", type(exc).__name__)
    """)
    r = sandbox.exec("python3 -", stdin=script)
    assert "REFUSED" in r.stdout, r.stdout + r.stderr
    log = sandbox.network_log().connections
    assert [(c.host, c.verdict) for c in log] == [("pypi.org", "denied")]
    assert log[0].rule.startswith("sni-mismatch") and log[0].sni == "example.com"
    assert len(internet.requests()) == before  # no request reached an origin


def test_raw_sockets_udp_and_dns_have_no_route(sandbox: Sandbox, internet: TestInternet) -> None:
    sandbox.set_network(NetworkPolicy.public(), phase=Phase.AGENT)
    address = internet.hosts["pypi.org"]
    script = textwrap.dedent(f"""
        import socket
        for what, call in [
            ("tcp", lambda: socket.create_connection(("{address}", 443), timeout=3)),
            ("echo", lambda: socket.create_connection(("{address}", 7), timeout=3)),
            ("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"q", ("{address}", 53))),
            ("dns", lambda: socket.getaddrinfo("pypi.org", 443)),
        ]:
            try:
                call()
                print(what, "REACHED")
            except OSError as exc:
                print(what, "blocked", exc.errno)
    """)
    r = sandbox.exec("python3 -", stdin=script)
    assert "REACHED" not in r.stdout and r.stdout.count("blocked") == 4, r.stdout + r.stderr
    assert sandbox.exec("ping -c1 -W1 " + address + " >/dev/null 2>&1").exit_code != 0
    assert internet.udp_datagrams() == []
    assert not any(c["client"] != internet.host_address for c in internet.tcp_connections())
    assert sandbox.network_log().connections == ()  # nothing of it went through the proxy


def test_a_sandbox_cannot_take_the_proxy_port_or_reach_the_host_proxy_otherwise(sandbox: Sandbox) -> None:
    sandbox.set_network(NetworkPolicy.offline(), phase=Phase.AGENT)
    r = sandbox.exec("python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 3128))\"")
    assert r.exit_code != 0 and "Address already in use" in r.stderr


def test_a_garbage_request_is_invalid_and_recorded(sandbox: Sandbox) -> None:
    sandbox.set_network(NetworkPolicy.public(), phase=Phase.AGENT)
    r = sandbox.exec("printf 'HELLO\\r\\n\\r\\n' | python3 -c \"import socket,sys; s=socket.create_connection(("
                     "'127.0.0.1', 3128)); s.sendall(sys.stdin.buffer.read()); print(s.recv(100))\"")  # fmt: skip
    assert "400" in r.stdout
    assert [c.verdict for c in sandbox.network_log().connections] == ["invalid"]


# -- phases, restore and verification ---------------------------------------------------------


def test_restore_ends_the_policy_the_variables_and_the_record(sandbox: Sandbox) -> None:
    env = sandbox.set_network(NetworkPolicy.public(), phase=Phase.AGENT)
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:3128" and "SSL_CERT_FILE" in env
    assert sandbox.exec(f"{CURL} https://pypi.org/_echo").stdout == "200"
    sandbox.restore()
    assert sandbox.exec("echo ${HTTPS_PROXY:-none}").stdout == "none\n"
    assert sandbox.exec(f"{CURL} --proxy http://127.0.0.1:3128 https://pypi.org/_echo").exit_code != 0
    assert sandbox.network_log().connections == ()


@pytest.mark.parametrize("mode", ["strict", "shared"])
def test_the_verifier_phase_has_its_own_policy_and_record(
    net_backend: Backend, net_snap: Snapshot, tmp_path: Path, mode: str
) -> None:
    if mode not in net_backend.capabilities.verification:
        pytest.skip(f"the {net_backend.name} backend does not verify {mode}")
    tests = tmp_path / "tests"
    tests.mkdir()
    with net_backend.create(net_snap) as sandbox:
        sandbox.set_network(NetworkPolicy.offline(), phase=Phase.AGENT)
        assert sandbox.exec(f"{CURL} https://pypi.org/_echo").exit_code != 0
        # a background process that keeps trying through the verifier's turn
        sandbox.exec(f"(setsid sh -c 'while :; do {CURL} https://example.com/ >/dev/null 2>&1; sleep 0.2; done' "
                     ">/dev/null 2>&1 &)")  # fmt: skip
        plan = VerificationPlan(VerifyMode.parse(mode), tests_dir=tests, outputs=("/workspace",), known_good=net_snap)
        sandbox.begin_verification(plan)
        sandbox.set_network(NetworkPolicy.allowlist(["pypi.org"]), phase=Phase.VERIFIER)
        assert sandbox.exec(f"{CURL} https://pypi.org/_echo").stdout == "200"
        log = sandbox.network_log().connections
    agent = [(c.host, c.verdict) for c in log if c.phase == "agent"]
    verifier = [(c.host, c.verdict) for c in log if c.phase == "verifier"]
    assert agent[0] == ("pypi.org", "denied")
    assert ("pypi.org", "allowed") in verifier
    # the agent's background loop got nothing in the verifier's phase (strict: it is dead)
    assert ("example.com", "allowed") not in verifier


# -- the machine's side: upstream proxy and extra CAs -------------------------------------------


def test_an_upstream_proxy_carries_every_allowed_connection(
    net_backend: Backend, internet: TestInternet, tmp_path: Path
) -> None:
    """A corporate network: the names resolve only at the upstream proxy, which relays everything."""
    egress = egress_options(internet, hosts={}, upstream_proxy=internet.upstream_proxy)
    before = len(internet.proxy_requests())
    with fresh_sandbox(net_backend.name, tmp_path, egress) as sandbox:
        sandbox.set_network(NetworkPolicy.allowlist(["pypi.org", "github.com"]), phase=Phase.AGENT)
        assert sandbox.exec(f"{CURL} https://pypi.org/_echo").stdout == "200"
        assert sandbox.exec(f"{CURL} http://github.com/_echo").stdout == "200"
        assert sandbox.exec(f"{CURL} https://example.com/_echo").exit_code != 0  # still the policy's call
        log = sandbox.network_log().connections
    relayed = [(r["method"], r["host"]) for r in internet.proxy_requests()[before:]]
    assert relayed == [("CONNECT", "pypi.org"), ("GET", "github.com")]
    assert [(c.host, c.verdict) for c in log] == [("pypi.org", "allowed"), ("github.com", "allowed"),
                                                  ("example.com", "denied")]  # fmt: skip


def test_without_the_extra_ca_the_sandbox_does_not_trust_the_test_origins(
    net_backend: Backend, internet: TestInternet, tmp_path: Path
) -> None:
    with fresh_sandbox(net_backend.name, tmp_path, egress_options(internet, extra_ca_files=[])) as sandbox:
        env = sandbox.set_network(NetworkPolicy.public(), phase=Phase.AGENT)
        assert "SSL_CERT_FILE" not in env
        r = sandbox.exec(f"{CURL} https://pypi.org/_echo")
        assert r.exit_code != 0 and "certificate" in r.stderr.lower()
        assert sandbox.exec(f"{CURL} http://pypi.org/_echo").stdout == "200"


def test_trust_host_cas_adds_the_hosts_bundle_to_what_sandboxes_trust(
    net_backend: Backend, internet: TestInternet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mirror whose private CA the host trusts (here through ``SSL_CERT_FILE``, as OpenSSL reads it):
    ``trust_host_cas`` alone, no ``extra_ca_files``, and HTTPS to it verifies inside the sandbox."""
    host_bundle = tmp_path / "host-ca-certificates.crt"
    host_bundle.write_bytes(internet.ca.cert_path.read_bytes())
    monkeypatch.setenv("SSL_CERT_FILE", str(host_bundle))
    options = egress_options(internet, extra_ca_files=[], trust_host_cas=True)
    with fresh_sandbox(net_backend.name, tmp_path, options) as sandbox:
        env = sandbox.set_network(NetworkPolicy.public(), phase=Phase.AGENT)
        assert "SSL_CERT_FILE" in env
        answer = sandbox.exec(f"{CURL} https://pypi.org/_echo")
        assert answer.stdout == "200", answer.stderr


def test_the_audit_counts_bytes_each_way(sandbox: Sandbox, internet: TestInternet) -> None:
    (internet.site("github.com") / "blob.bin").write_bytes(b"x" * 300_000)
    sandbox.set_network(NetworkPolicy.public(), phase=Phase.AGENT)
    r = sandbox.exec("head -c 200000 /dev/zero | curl -sS -m 20 -o /dev/null -w '%{http_code}' "
                     "--data-binary @- https://github.com/_echo; "
                     f"{CURL} https://github.com/blob.bin")  # fmt: skip
    assert r.stdout == "200200", r.stderr
    upload, download = sandbox.network_log().connections
    assert upload.bytes_up > 200_000 and download.bytes_down > 300_000
    assert wait_until(lambda: internet.requests("github.com"))
    json.dumps([c.as_dict() for c in (upload, download)])  # JSON-ready


def test_this_machines_own_global_address_is_refused(sandbox: Sandbox) -> None:
    """A cloud VM's public address reaches the same services as its loopback: a host service bound to
    0.0.0.0 must stay out of reach even under public, through the address the machine itself holds."""
    import socket
    import subprocess
    import threading

    from pool.egress import addresses

    address = "1.2.3.4"
    server = socket.create_server(("0.0.0.0", 0))
    port = server.getsockname()[1]
    reached: list[bool] = []
    threading.Thread(target=lambda: reached.append(bool(server.accept())), daemon=True).start()
    subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    try:
        addresses._host_addresses = (float("-inf"), frozenset())  # read the interfaces again now
        sandbox.set_network(NetworkPolicy.public(), phase=Phase.AGENT)
        r = sandbox.exec(f"{CURL} http://{address}:{port}/")
    finally:
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False)
        server.close()
        addresses._host_addresses = (float("-inf"), frozenset())
    assert r.stdout == "403"
    (attempt,) = sandbox.network_log().connections
    assert attempt.verdict == "denied" and attempt.rule == f"this machine's address {address}"
    assert reached == []
