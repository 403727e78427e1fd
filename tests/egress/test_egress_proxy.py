"""The egress proxy against real sockets: origins on 127.0.0.x, gates on loopback listeners,
clients speaking raw HTTP, TLS through CONNECT, and curl."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pool.egress.addresses import refusal
from pool.egress.connection.route import upstream_authorization
from pool.egress.connection.sni import Truncated, server_name
from pool.egress.gate import Gate
from pool.egress.limits import ProxyLimits
from pool.egress.proxy import EgressProxy
from pool.egress.settings import EgressSettings
from pool.errors import BackendError, ConfigError
from pool.network.audit import Connection
from pool.network.policy import NetworkPolicy, Phase
from tests.support.servers.tcp_server import TcpServer
from tests.support.servers.testca import TestCA

WEB, SECURE, ECHO = "127.0.0.2", "127.0.0.3", "127.0.0.4"
HOSTS = {
    "web.test": WEB,
    "other.test": WEB,  # another name for the same server: Host and SNI checks must tell them apart
    "secure.test": SECURE,
    "api.secure.test": SECURE,
    "echo.test": ECHO,
    "closed.test": "127.0.0.5",
    "private.test": "10.0.0.3",
}
TRUSTING = EgressSettings(hosts=HOSTS, trusted_networks=("127.0.0.0/8",), connect_timeout_s=2)
LIMITS = ProxyLimits(head_timeout_s=2, reply_timeout_s=1)
TIMEOUT_S = 5.0


# --- origins -------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    """Answers ``<method> <path> host=<Host> body=<body>`` and remembers each request."""

    def _answer(self) -> None:
        body = b""
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        elif length := int(self.headers.get("Content-Length", "0")):
            body = self.rfile.read(length)
        server: _Web = self.server  # type: ignore[assignment]
        server.seen.append((self.command, self.path, dict(self.headers.items()), body))
        reply = f"{self.command} {self.path} host={self.headers.get('Host')} body={body.decode()}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Web(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: str, context: ssl.SSLContext | None = None) -> None:
        super().__init__((address, 0), _Handler)
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        if context is not None:
            self.socket = context.wrap_socket(self.socket, server_side=True)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        return [path for _, path, _, _ in self.seen]


@dataclass
class _Echo:
    """A TCP server that echoes and keeps what each connection sent, once it ended."""

    received: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.server = TcpServer(ECHO, self._echo)
        self.port = self.server.port

    def _echo(self, conn: socket.socket) -> None:
        got = b""
        with conn:
            try:
                while data := conn.recv(65536):
                    got += data
                    conn.sendall(data)
            except OSError:
                pass
        self.received.append(got)

    def close(self) -> None:
        self.server.close()


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("egress-ca"))


@pytest.fixture(scope="module")
def web() -> Iterator[_Web]:
    server = _Web(WEB)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def secure(ca: TestCA) -> Iterator[_Web]:
    issued = ca.issue(["secure.test", "api.secure.test"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(issued.cert_path, issued.key_path)
    server = _Web(SECURE, context)
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def echo() -> Iterator[_Echo]:
    server = _Echo()
    yield server
    server.close()


@pytest.fixture
def proxy() -> Iterator[EgressProxy]:
    with EgressProxy(TRUSTING, limits=LIMITS) as p:
        yield p


# --- clients -------------------------------------------------------------------------------------------


def open_gate(proxy: EgressProxy, policy: NetworkPolicy, phase: Phase = Phase.AGENT) -> tuple[Gate, int]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    return proxy.open_gate(listener, policy, phase), port


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    sock.settimeout(TIMEOUT_S)
    return sock


def read_all(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def exchange(port: int, request: bytes) -> tuple[int, bytes]:
    """Send ``request``, read the answer to its end: its status and body."""
    with connect(port) as sock:
        sock.sendall(request)
        answer = read_all(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def get(port: int, url: str, **headers: str) -> tuple[int, bytes]:
    lines = [f"GET {url} HTTP/1.1", *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items()), "", ""]
    return exchange(port, "\r\n".join(lines).encode())


def tunnel(port: int, authority: str) -> tuple[socket.socket, int, bytes]:
    """A CONNECT tunnel: the socket, the proxy's status and the body of a refusal."""
    sock = connect(port)
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        chunk = sock.recv(1)
        assert chunk, f"the proxy closed after {head!r}"
        head += chunk
    status = int(head.split(b" ")[1])
    return sock, status, b"" if status == 200 else read_all(sock)


def knock(port: int, authority: str) -> tuple[int, bytes]:
    """CONNECT, and hang up: the proxy's status and the body of its refusal."""
    sock, status, body = tunnel(port, authority)
    sock.close()
    return status, body


def https_get(sock: socket.socket, ca: TestCA, name: str, path: str) -> bytes:
    context = ssl.create_default_context(cafile=str(ca.cert_path))
    with context.wrap_socket(sock, server_hostname=name) as tls:
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        return read_all(tls).partition(b"\r\n\r\n")[2]


def client_hello(name: str | None) -> bytes:
    context = ssl.create_default_context()
    if name is None:
        context.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def records(gate: Gate, count: int) -> list[Connection]:
    """The next ``count`` records of ``gate`` (they are written as connections end)."""
    found: list[Connection] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(found) < count and time.monotonic() < deadline:
        found += gate.drain()[0]
        time.sleep(0.01)
    assert len(found) == count, found
    return sorted(found, key=lambda record: record.time)  # drains return them by start only within one drain


def curl(port: int, ca: TestCA, url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    command = ["curl", "-sS", "--max-time", "5", "--proxy", f"http://127.0.0.1:{port}", "--cacert", str(ca.cert_path)]
    return subprocess.run([*command, url], capture_output=True, text=True, env=env, timeout=10)


def wait_until(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


# --- pieces --------------------------------------------------------------------------------------------


def test_refusal_rules() -> None:
    settings = EgressSettings(trusted_networks=("192.168.5.0/24",))
    for text in ["10.0.0.3", "127.0.0.1", "169.254.169.254", "100.64.0.1", "fd00::1", "::ffff:10.0.0.3",
                 "224.0.0.1", "64:ff9b::a00:3", "2002:a00:3::", "::", "0.0.0.0"]:  # fmt: skip
        assert refusal(ipaddress.ip_address(text), 443, settings) is not None, text
    assert refusal(ipaddress.ip_address("10.0.0.3"), 80, settings) == "non-global address 10.0.0.3"
    assert refusal(ipaddress.ip_address("192.168.5.7"), 80, settings) is None
    assert refusal(ipaddress.ip_address("8.8.8.8"), 443, settings) is None
    assert refusal(ipaddress.ip_address("8.8.8.8"), 6379, settings) == "denied port 6379"
    assert refusal(None, 8265, settings) == "denied port 8265"


def test_sni_is_read_from_whole_split_and_broken_hellos() -> None:
    hello = client_hello("Secure.Test")
    assert server_name(hello) == "Secure.Test"
    assert server_name(client_hello(None)) is None
    body = hello[5:]
    split = hello[:3] + (100).to_bytes(2, "big") + body[:100] + hello[:3] + (len(body) - 100).to_bytes(2, "big")
    assert server_name(split + body[100:]) == "Secure.Test"
    with pytest.raises(Truncated):
        server_name(split)
    with pytest.raises(Truncated):
        server_name(hello[:40])
    rng = random.Random(7)
    for _ in range(3000):
        broken = bytearray(hello)
        for _ in range(rng.randint(1, 4)):
            broken[rng.randrange(len(broken))] = rng.randrange(256)
        for data in (bytes(broken), bytes(broken[: rng.randrange(len(broken))]), rng.randbytes(64)):
            with contextlib.suppress(ValueError):
                server_name(data)


def test_upstream_credentials_come_from_its_url() -> None:
    settings = EgressSettings(upstream_proxy="http://user:p%40ss@proxy.corp:3128")
    assert upstream_authorization(settings) == "Basic dXNlcjpwQHNz"
    assert upstream_authorization(EgressSettings(upstream_proxy="http://proxy.corp:3128")) is None


# --- policies ------------------------------------------------------------------------------------------


def test_public_forwards_plain_http_in_origin_form(proxy: EgressProxy, web: _Web) -> None:
    gate, port = open_gate(proxy, NetworkPolicy.public())
    url = f"http://web.test:{web.port}/plain?q=1"
    status, body = get(
        port, url, Host=f"web.test:{web.port}", Proxy_Authorization="Basic c2VjcmV0", Proxy_Connection="keep-alive"
    )
    assert (status, body) == (200, f"GET /plain?q=1 host=web.test:{web.port} body=".encode())
    _, path, headers, _ = web.seen[-1]
    assert path == "/plain?q=1"
    assert "Proxy-Authorization" not in headers and "Proxy-Connection" not in headers
    assert headers["Connection"] == "close"
    (record,) = records(gate, 1)
    assert (record.kind, record.verdict, record.rule, record.address) == ("http", "allowed", "public", WEB)
    assert record.url == f"GET {url}" and record.host == "web.test" and record.port == web.port
    assert record.bytes_down > len(body) and record.bytes_up > 0 and "c2VjcmV0" not in repr(record)


def test_public_request_body_is_forwarded_and_nothing_after_it(proxy: EgressProxy, web: _Web) -> None:
    gate, port = open_gate(proxy, NetworkPolicy.public())
    base = f"http://web.test:{web.port}"
    smuggled = f"GET {base}/smuggled HTTP/1.1\r\nHost: other.test\r\n\r\n"
    status, body = exchange(port, f"POST {base}/post HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello{smuggled}".encode())
    assert (status, body) == (200, f"POST /post host=web.test:{web.port} body=hello".encode())
    chunked = f"POST {base}/chunked HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    assert exchange(port, chunked.encode())[1].endswith(b"body=hello")
    ambiguous = f"POST {base}/x HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert exchange(port, ambiguous.encode())[0] == 400
    assert "/smuggled" not in web.paths() and "/x" not in web.paths()
    assert [r.verdict for r in records(gate, 3)] == ["allowed", "allowed", "invalid"]


def test_public_tunnels_https_for_curl(proxy: EgressProxy, secure: _Web, web: _Web, ca: TestCA) -> None:
    gate, port = open_gate(proxy, NetworkPolicy.public())
    done = curl(port, ca, f"https://secure.test:{secure.port}/curl")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"GET /curl host=secure.test:{secure.port} body="
    assert curl(port, ca, f"http://web.test:{web.port}/curl-plain").stdout.startswith("GET /curl-plain")
    tls, plain = records(gate, 2)
    assert (tls.kind, tls.verdict, tls.sni, tls.host, tls.address) == (
        "connect",
        "allowed",
        "secure.test",
        "secure.test",
        SECURE,
    )
    assert tls.bytes_up > 200 and tls.bytes_down > 200 and tls.duration_s > 0
    assert (plain.kind, plain.verdict) == ("http", "allowed")


def test_no_network_refuses_with_a_reason_and_without_a_lookup(proxy: EgressProxy, secure: _Web) -> None:
    gate, port = open_gate(proxy, NetworkPolicy.offline())
    status, body = knock(port, f"secure.test:{secure.port}")
    assert status == 403
    assert body == f"snapgym egress: secure.test:{secure.port} refused in the agent phase (no-network)\n".encode()
    # A lookup would leak the name to its DNS server; refused names are never looked up.
    assert get(port, "http://exfiltrated-secret.example.invalid/")[0] == 403
    denied = records(gate, 2)
    assert [(r.verdict, r.rule, r.kind) for r in denied] == [
        ("denied", "no-network", "connect"),
        ("denied", "no-network", "http"),
    ]
    assert denied[1].address is None


def test_allowlist_by_name_wildcard_cidr_and_port(
    proxy: EgressProxy, web: _Web, secure: _Web, ca: TestCA, echo: _Echo
) -> None:
    names, port = open_gate(proxy, NetworkPolicy.allowlist(["web.test"]))
    assert get(port, f"http://web.test:{web.port}/n")[0] == 200
    assert get(port, f"http://other.test:{web.port}/n")[0] == 403  # same address, other name
    assert [r.rule for r in records(names, 2)] == ["allowlist:web.test", "allowlist:no match"]

    wildcard, port = open_gate(proxy, NetworkPolicy.allowlist(["*.secure.test"]))
    sock, status, _ = tunnel(port, f"api.secure.test:{secure.port}")
    assert status == 200 and https_get(sock, ca, "api.secure.test", "/w").startswith(b"GET /w")
    assert knock(port, f"secure.test:{secure.port}")[0] == 403  # not the apex
    assert [r.verdict for r in records(wildcard, 2)] == ["allowed", "denied"]

    cidr, port = open_gate(proxy, NetworkPolicy.allowlist([f"{ECHO}/32"]))
    assert knock(port, f"echo.test:{echo.port}")[0] == 200
    assert knock(port, f"web.test:{web.port}")[0] == 403
    assert [r.rule for r in records(cidr, 2)] == [f"allowlist:{ECHO}/32", "allowlist:no match"]

    _ports, port = open_gate(proxy, NetworkPolicy.allowlist([f"web.test:{web.port}"]))
    assert get(port, f"http://web.test:{web.port}/p")[0] == 200
    assert get(port, f"http://web.test:{echo.port}/p")[0] == 403


def test_non_global_addresses_are_refused_under_public(web: _Web) -> None:
    untrusting = EgressSettings(hosts=HOSTS)
    with EgressProxy(untrusting, limits=LIMITS) as proxy:
        gate, port = open_gate(proxy, NetworkPolicy.public())
        cases = {
            "private.test:80": "non-global address 10.0.0.3",  # a name that resolves inside
            f"web.test:{web.port}": f"non-global address {WEB}",
            "169.254.169.254:80": "non-global address 169.254.169.254",
            "[::ffff:127.0.0.1]:80": "this machine's address 127.0.0.1",  # loopback is this machine's too
            "localhost:80": "non-global name localhost",
        }
        for authority, rule in cases.items():
            status, body = knock(port, authority)
            assert status == 403 and body.endswith(f"({rule})\n".encode()), (authority, body)
        assert get(port, f"http://{WEB}:{web.port}/")[0] == 403
        assert knock(port, "127.1:80")[0] == 400  # an address in disguise is no host name
        assert [r.verdict for r in records(gate, 7)] == ["denied"] * 6 + ["invalid"]
    assert web.paths().count("/") == 0


def test_ray_ports_are_refused_even_on_trusted_networks(proxy: EgressProxy) -> None:
    gate, port = open_gate(proxy, NetworkPolicy.public())
    assert knock(port, "web.test:6379")[1].endswith(b"(denied port 6379)\n")
    assert records(gate, 1)[0].rule == "denied port 6379"


# --- tunnels that say another host ---------------------------------------------------------------------


def test_sni_naming_another_host_is_cut_before_the_origin_gets_a_byte(proxy: EgressProxy, echo: _Echo) -> None:
    gate, port = open_gate(proxy, NetworkPolicy.public())
    sock, status, _ = tunnel(port, f"echo.test:{echo.port}")
    assert status == 200
    with sock:
        sock.sendall(client_hello("evil.test"))
        assert read_all(sock) == b""
    wait_until(lambda: echo.received, "the origin connection ended")
    assert echo.received == [b""]
    (record,) = records(gate, 1)
    assert (record.verdict, record.rule, record.sni, record.bytes_up) == (
        "denied",
        "sni-mismatch: evil.test",
        "evil.test",
        0,
    )

    hello = client_hello("ECHO.test")
    sock, status, _ = tunnel(port, f"echo.test:{echo.port}")
    sock.sendall(hello)
    assert sock.recv(len(hello), socket.MSG_WAITALL) == hello
    sock.close()
    assert records(gate, 1)[0].sni == "ECHO.test"


def test_openings_trickled_a_byte_at_a_time_are_judged_whole(proxy: EgressProxy, echo: _Echo) -> None:
    gate, port = open_gate(proxy, NetworkPolicy.public())
    for opening in (client_hello("evil.test"), b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"):
        sock, status, _ = tunnel(port, f"echo.test:{echo.port}")
        with sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for i in range(len(opening)):
                sock.send(opening[i : i + 1])
            assert status == 200 and read_all(sock) == b""
    assert [r.rule for r in records(gate, 2)] == ["sni-mismatch: evil.test", "host-mismatch: evil.test"]
    wait_until(lambda: len(echo.received) == 2, "the origin connections ended")
    assert echo.received == [b"", b""]


def test_host_header_naming_another_host_is_refused(proxy: EgressProxy, web: _Web) -> None:
    gate, port = open_gate(proxy, NetworkPolicy.public())
    status, body = get(port, f"http://web.test:{web.port}/plain-mismatch", Host="other.test")
    assert status == 403 and b"host-mismatch: other.test" in body
    sock, status, _ = tunnel(port, f"web.test:{web.port}")
    with sock:
        sock.sendall(b"GET /tunnel-mismatch HTTP/1.1\r\nHost: other.test\r\n\r\n")
        assert status == 200 and read_all(sock) == b""
    sock, _, _ = tunnel(port, f"web.test:{web.port}")
    with sock:
        sock.sendall(f"GET /tunnel-match HTTP/1.1\r\nHost: web.test:{web.port}\r\n\r\n".encode())
        assert b"GET /tunnel-match" in read_all(sock)
    assert [r.rule for r in records(gate, 3)] == ["host-mismatch: other.test"] * 2 + ["public"]
    assert "/tunnel-match" in web.paths()
    assert "/plain-mismatch" not in web.paths() and "/tunnel-mismatch" not in web.paths()


# --- requests the proxy cannot serve -------------------------------------------------------------------


def test_requests_that_are_not_proxy_requests_get_400(proxy: EgressProxy) -> None:
    gate, port = open_gate(proxy, NetworkPolicy.public())
    assert exchange(port, b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n")[0] == 400
    assert exchange(port, b"\x00\x01 garbage\r\n\r\n")[0] == 400
    status, body = exchange(port, b"GET http://web.test/ HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n")
    assert status == 400 and b"over 65536 bytes" in body
    assert exchange(port, b"GET http://user@web.test/ HTTP/1.1\r\n\r\n")[0] == 400
    found = records(gate, 4)
    assert {(r.verdict, r.rule) for r in found} == {("invalid", "invalid request")}
    assert all(r.error for r in found)


def test_unreachable_destination_gets_502(proxy: EgressProxy) -> None:
    gate, port = open_gate(proxy, NetworkPolicy.public())
    with socket.create_server(("127.0.0.5", 0)) as probe:
        free = probe.getsockname()[1]
    status, body = knock(port, f"closed.test:{free}")
    assert status == 502 and b"connection refused" in body
    (record,) = records(gate, 1)
    assert (record.verdict, record.rule, record.error, record.address) == (
        "unreachable",
        "public",
        "connection refused",
        "127.0.0.5",
    )


# --- accounting and lifecycle --------------------------------------------------------------------------


def test_bytes_are_counted_each_way(proxy: EgressProxy, echo: _Echo) -> None:
    gate, port = open_gate(proxy, NetworkPolicy.public())
    sock, _, _ = tunnel(port, f"echo.test:{echo.port}")
    payload = b"SSH-2.0-x\r\n" + bytes(range(256)) * 100
    sock.sendall(payload)
    sock.shutdown(socket.SHUT_WR)
    assert read_all(sock) == payload
    sock.close()
    (record,) = records(gate, 1)
    assert (record.bytes_up, record.bytes_down, record.sni, record.error) == (len(payload), len(payload), None, None)


def test_set_policy_cuts_open_connections_and_switches_phase(proxy: EgressProxy, echo: _Echo) -> None:
    gate, port = open_gate(proxy, NetworkPolicy.public())
    sock, _, _ = tunnel(port, f"echo.test:{echo.port}")
    sock.sendall(b"ping")
    assert sock.recv(4) == b"ping"
    gate.set_policy(NetworkPolicy.offline(), Phase.VERIFIER)
    (cut,) = gate.drain()[0]  # written before set_policy returned
    assert (cut.phase, cut.verdict, cut.error, cut.bytes_up) == ("agent", "allowed", "cut: the policy changed", 4)
    with sock:
        assert read_all(sock) == b""
    assert gate.phase is Phase.VERIFIER
    assert b"refused in the verifier phase (no-network)" in knock(port, f"echo.test:{echo.port}")[1]
    assert records(gate, 1)[0].phase == "verifier"


def test_close_cuts_and_is_idempotent(echo: _Echo) -> None:
    proxy = EgressProxy(TRUSTING, limits=LIMITS)
    gate, port = open_gate(proxy, NetworkPolicy.public())
    sock, _, _ = tunnel(port, f"echo.test:{echo.port}")
    gate.close()
    gate.close()
    (cut,) = gate.drain()[0]
    assert cut.error == "cut: the gate closed"
    with sock:
        assert read_all(sock) == b""
    with pytest.raises(ConnectionRefusedError):
        connect(port)
    with pytest.raises(BackendError):
        gate.set_policy(NetworkPolicy.public(), Phase.AGENT)
    other, _ = open_gate(proxy, NetworkPolicy.public())
    proxy.close()
    proxy.close()
    assert other.is_closed
    listener = socket.create_server(("127.0.0.1", 0))
    with pytest.raises(BackendError):
        proxy.open_gate(listener, NetworkPolicy.public(), Phase.AGENT)
    assert listener.fileno() == -1  # the proxy owned it


def test_open_gate_wants_a_listening_socket(proxy: EgressProxy) -> None:
    with pytest.raises(ConfigError):
        proxy.open_gate(socket.socket(), NetworkPolicy.public(), Phase.AGENT)


def test_each_gate_sees_only_its_own_records(proxy: EgressProxy, web: _Web) -> None:
    mine, port = open_gate(proxy, NetworkPolicy.public())
    theirs, _ = open_gate(proxy, NetworkPolicy.public())
    assert get(port, f"http://web.test:{web.port}/mine")[0] == 200
    assert records(mine, 1)[0].url == f"GET http://web.test:{web.port}/mine"
    assert theirs.drain() == ([], 0)


def test_silent_and_slow_clients_do_not_block_others(proxy: EgressProxy, web: _Web) -> None:
    gate, port = open_gate(proxy, NetworkPolicy.public())
    silent, partial = connect(port), connect(port)
    partial.sendall(b"GET http://web.test/ HT")
    assert get(port, f"http://web.test:{web.port}/busy")[0] == 200
    _other, other_port = open_gate(proxy, NetworkPolicy.public())
    assert get(other_port, f"http://web.test:{web.port}/busy")[0] == 200
    assert records(gate, 1)[0].verdict == "allowed"
    silent.close()
    partial.close()
    errors = sorted(str(r.error) for r in records(gate, 2))
    assert errors == ["closed before sending a request", "closed inside the request head"]
    status, body = exchange(port, b"")  # says nothing until the head timeout
    assert status == 400 and b"did not arrive in time" in body


def test_connections_and_records_are_capped_per_gate(web: _Web) -> None:
    limits = ProxyLimits(max_connections=3, max_records=3, reply_timeout_s=1)
    with EgressProxy(TRUSTING, limits=limits) as proxy:
        gate, port = open_gate(proxy, NetworkPolicy.public())
        idle = [connect(port) for _ in range(3)]
        status, body = exchange(port, b"")
        assert status == 503 and b"too many connections" in body
        for sock in idle:
            sock.close()
        wait_until(lambda: gate.open_connections == 0, "the idle connections ended")
        found, dropped = gate.drain()
        assert (len(found), dropped) == (3, 1)
        # The refusal was written first; the third idle connection to end found the records full.
        assert [(r.verdict, r.rule) for r in found] == [("invalid", "invalid request")] * 2 + [
            ("denied", "too many connections")
        ]
        assert get(port, f"http://web.test:{web.port}/after")[0] == 200


def test_idle_tunnels_are_cut(echo: _Echo) -> None:
    with EgressProxy(TRUSTING, limits=ProxyLimits(idle_timeout_s=0.3, reply_timeout_s=0.2)) as proxy:
        gate, port = open_gate(proxy, NetworkPolicy.public())
        sock, _, _ = tunnel(port, f"echo.test:{echo.port}")
        with sock:
            assert read_all(sock) == b""
        assert records(gate, 1)[0].error == "idle timeout"


# --- an upstream proxy ---------------------------------------------------------------------------------


def test_traffic_goes_through_the_upstream_proxy(web: _Web, secure: _Web, ca: TestCA) -> None:
    with EgressProxy(TRUSTING, limits=LIMITS) as upstream_proxy:
        upstream, upstream_port = open_gate(upstream_proxy, NetworkPolicy.public())
        settings = EgressSettings(upstream_proxy=f"http://127.0.0.1:{upstream_port}", connect_timeout_s=2)
        with EgressProxy(settings, limits=LIMITS) as proxy:
            gate, port = open_gate(proxy, NetworkPolicy.allowlist(["secure.test", "web.test"]))
            done = curl(port, ca, f"https://secure.test:{secure.port}/via")
            assert done.stdout.startswith("GET /via"), done.stderr
            assert get(port, f"http://web.test:{web.port}/via-plain")[0] == 200
            assert knock(port, f"other.test:{web.port}")[0] == 403  # refused here, never sent on
            assert knock(port, "10.0.0.3:80")[0] == 403
            mine = records(gate, 4)
            assert [(r.verdict, r.address) for r in mine[:2]] == [("allowed", None), ("allowed", None)]
            theirs = records(upstream, 2)
            assert [(r.kind, r.host, r.sni) for r in theirs] == [
                ("connect", "secure.test", "secure.test"),
                ("http", "web.test", None),
            ]
            assert theirs[1].url == f"GET http://web.test:{web.port}/via-plain"
            upstream.set_policy(NetworkPolicy.offline(), Phase.AGENT)
            status, body = knock(port, f"secure.test:{secure.port}")
            assert status == 502 and b"upstream proxy answered 403" in body
            assert records(gate, 1)[0].verdict == "unreachable"
