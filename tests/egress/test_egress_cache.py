"""The egress proxy's download cache against real sockets: origins on 127.0.0.x (HTTPS with a test CA),
gates on loopback listeners, curl as the sandbox's client. Record, stop the origins, replay."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import socket
import ssl
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pool.egress.cache import CacheMode, CacheSettings
from pool.egress.cache.__main__ import main as cache_cli
from pool.egress.cache.archive import export, import_
from pool.egress.gate import Gate
from pool.egress.limits import ProxyLimits
from pool.egress.proxy import EgressProxy
from pool.egress.settings import EgressSettings
from pool.errors import ConfigError
from pool.network.audit import Connection
from pool.network.policy import NetworkPolicy, Phase
from tests.support.servers.testca import TestCA

WEB, SECURE = "127.0.0.2", "127.0.0.3"
HOSTS = {"web.test": WEB, "secure.test": SECURE, "other.secure.test": SECURE}
LIMITS = ProxyLimits(head_timeout_s=2, reply_timeout_s=1, idle_timeout_s=10)
TIMEOUT_S = 5.0
FILE = random.Random(5).randbytes(300_000)
"""The body of /file: bigger than the proxy's chunks, so it is streamed in pieces."""


# --- origins -------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real origins

    def do_GET(self) -> None:
        self._seen(b"")
        if self.path == "/file":
            self._reply(200, FILE, [("Content-Type", "application/octet-stream"), ("ETag", '"v1"')])
        elif self.path == "/cookie":
            self._reply(200, b"with a cookie", [("Set-Cookie", "session=secret-of-the-recorder")])
        elif self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"first ", b"second"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self._reply(404, b"no such page " + self.path.encode(), [])

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._seen(body)
        self._reply(200, b"answer to " + body, [])

    def _seen(self, body: bytes) -> None:
        server: _Origin = self.server  # type: ignore[assignment]
        server.seen.append((self.command, self.path, body))

    def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        self.send_response(status)
        for name, value in [*headers, ("Content-Length", str(len(body)))]:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Origin(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: str, context: ssl.SSLContext | None = None) -> None:
        super().__init__((address, 0), _Handler)
        self.seen: list[tuple[str, str, bytes]] = []
        if context is not None:
            self.socket = context.wrap_socket(self.socket, server_side=True)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("origin-ca"))


@contextlib.contextmanager
def origins(ca: TestCA) -> Iterator[tuple[_Origin, _Origin]]:
    """A plain HTTP origin (web.test) and an HTTPS one (secure.test), stopped on exit."""
    issued = ca.issue(["secure.test", "other.secure.test"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(issued.cert_path, issued.key_path)
    web, secure = _Origin(WEB), _Origin(SECURE, context)
    try:
        yield web, secure
    finally:
        web.stop()
        secure.stop()


def settings(ca: TestCA, mode: str, folder: Path, **overrides: Any) -> EgressSettings:
    fields: dict[str, Any] = {"hosts": HOSTS, "trusted_networks": ["127.0.0.0/8"],
                              "extra_ca_files": [str(ca.cert_path)], "connect_timeout_s": 2}  # fmt: skip
    return EgressSettings.parse({**fields, "cache": {"mode": mode, "dir": str(folder)}, **overrides})


# --- clients -------------------------------------------------------------------------------------------


def open_gate(proxy: EgressProxy, policy: NetworkPolicy | None = None) -> tuple[Gate, int]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    return proxy.open_gate(listener, policy or NetworkPolicy.public(), Phase.VERIFIER), port


def bundle(proxy: EgressProxy, folder: Path) -> Path:
    """What a sandbox's CA bundle adds: the proxy's sandbox CAs, in one file."""
    path = folder / "sandbox-bundle.pem"
    path.write_bytes(b"".join(Path(p).read_bytes() for p in proxy.sandbox_ca_files))
    return path


@contextlib.contextmanager
def served(ca: TestCA, mode: str, folder: Path, **overrides: Any) -> Iterator[tuple[EgressProxy, Gate, int, Path]]:
    """A proxy with the cache in ``mode``, one public gate, and the CA bundle its sandboxes would trust."""
    with EgressProxy(settings(ca, mode, folder, **overrides), limits=LIMITS) as proxy:
        gate, port = open_gate(proxy)
        yield proxy, gate, port, bundle(proxy, folder.parent)


def curl(port: int, cafile: Path, url: str, *args: str) -> tuple[int, bytes, bytes]:
    """curl through the proxy: its exit status, the response head(s) and the body."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    command = ["curl", "-sS", "--max-time", "5", "--proxy", f"http://127.0.0.1:{port}", "--cacert", str(cafile),
               "-D", "/dev/stderr", *args, url]  # fmt: skip
    done = subprocess.run(command, capture_output=True, env=env, timeout=15)
    return done.returncode, done.stderr, done.stdout


def status_of(head: bytes) -> int:
    return int(head.split(b"\r\n\r\n")[-2].split(b" ")[1]) if b"\r\n\r\n" in head else 0


def records(gate: Gate, count: int) -> list[Connection]:
    found: list[Connection] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(found) < count and time.monotonic() < deadline:
        found += gate.drain()[0]
        time.sleep(0.01)
    assert len(found) == count, found
    return sorted(found, key=lambda record: record.time)


# --- record, then replay without the origins ------------------------------------------------------------


def test_recorded_downloads_replay_byte_for_byte_with_the_origins_gone(ca: TestCA, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    with origins(ca) as (web, secure):
        urls = [f"https://secure.test:{secure.port}/file", f"https://secure.test:{secure.port}/chunked",
                f"http://web.test:{web.port}/page", f"https://secure.test:{secure.port}/missing"]  # fmt: skip
        with served(ca, "record", folder) as (_, gate, port, cafile):
            recorded = [curl(port, cafile, url) for url in urls]
            assert [r[0] for r in recorded] == [0, 0, 0, 0], recorded
            assert recorded[0][2] == FILE and recorded[1][2] == b"first second"
            assert status_of(recorded[3][1]) == 404  # any status is a recording
            marks = [(r.verdict, r.cache, r.rule) for r in records(gate, 4)]
            assert marks == [("allowed", "stored", "public")] * 4
        assert len(secure.seen) == 3 and len(web.seen) == 1
    with served(ca, "replay", folder) as (_, gate, port, cafile):
        replayed = [curl(port, cafile, url) for url in urls]
        assert replayed == recorded  # the origins are gone: status, headers and bodies from the store
        found = records(gate, 4)
        assert {(r.verdict, r.cache, r.bytes_up) for r in found} == {("allowed", "hit", 0)}
        assert found[0].url == f"GET {urls[0]}" and found[0].address == SECURE

        _, head, body = curl(port, cafile, f"https://secure.test:{secure.port}/never-recorded")
        assert status_of(head) == 504 and f"https://secure.test:{secure.port}/never-recorded".encode() in body
        (miss,) = records(gate, 1)
        assert (miss.verdict, miss.cache) == ("denied", "miss")
        assert miss.rule == f"replay miss: https://secure.test:{secure.port}/never-recorded"


def test_a_replay_is_judged_by_the_policy_first(ca: TestCA, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    with origins(ca) as (_, secure), served(ca, "record", folder) as (_, gate, port, cafile):
        url = f"https://secure.test:{secure.port}/file"
        assert curl(port, cafile, url)[0] == 0
    with served(ca, "replay", folder) as (proxy, _, _, cafile):
        for policy, rule in ((NetworkPolicy.offline(), "no-network"),
                             (NetworkPolicy.allowlist(["web.test"]), "allowlist:no match")):  # fmt: skip
            gate, port = open_gate(proxy, policy)
            code, head, _ = curl(port, cafile, url)
            assert code != 0 and b"403" in head.split(b"\r\n")[0]
            (record,) = records(gate, 1)
            assert (record.verdict, record.rule, record.cache) == ("denied", rule, None)
        gate, port = open_gate(proxy, NetworkPolicy.allowlist(["secure.test"]))
        assert curl(port, cafile, url)[2] == FILE


def test_every_request_in_a_tunnel_must_name_its_host(ca: TestCA, tmp_path: Path) -> None:
    with origins(ca) as (_, secure), served(ca, "record", tmp_path / "cache") as (_, gate, port, cafile):
        context = ssl.create_default_context(cafile=str(cafile))
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as raw:
            authority = f"secure.test:{secure.port}"
            raw.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
            assert raw.recv(4096).startswith(b"HTTP/1.1 200")
            with context.wrap_socket(raw, server_hostname="secure.test") as tls:
                tls.sendall(f"GET /cookie HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
                tls.sendall(f"GET /file HTTP/1.1\r\nHost: other.secure.test:{secure.port}\r\n\r\n".encode())
                answer = b""
                with contextlib.suppress(OSError):
                    while data := tls.recv(65536):
                        answer += data
        assert answer.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 403" in answer
        assert [path for _, path, _ in secure.seen] == ["/cookie"]  # the second never left the proxy
        (record,) = records(gate, 1)
        assert (record.verdict, record.rule) == ("denied", "host-mismatch: other.secure.test")


def test_recording_through_an_upstream_proxy(ca: TestCA, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    upstream_settings = EgressSettings(hosts=HOSTS, trusted_networks=("127.0.0.0/8",), connect_timeout_s=2)
    with origins(ca) as (web, secure), EgressProxy(upstream_settings, limits=LIMITS) as upstream_proxy:
        upstream, upstream_port = open_gate(upstream_proxy)
        via = {"hosts": {}, "trusted_networks": [], "upstream_proxy": f"http://u:p@127.0.0.1:{upstream_port}"}
        with served(ca, "record", folder, **via) as (_, gate, port, cafile):
            assert curl(port, cafile, f"https://secure.test:{secure.port}/file")[2] == FILE
            assert curl(port, cafile, f"http://web.test:{web.port}/page")[2] == b"no such page /page"
            assert [(r.cache, r.address) for r in records(gate, 2)] == [("stored", None), ("stored", None)]
        theirs = records(upstream, 2)
        assert [(r.kind, r.host, r.sni) for r in theirs] == [("connect", "secure.test", "secure.test"),
                                                             ("http", "web.test", None)]  # fmt: skip
        assert theirs[1].url == f"GET http://web.test:{web.port}/page"
    with served(ca, "replay", folder) as (_, _, port, cafile):
        assert curl(port, cafile, f"https://secure.test:{secure.port}/file")[2] == FILE


# --- what is stored, and what is not ----------------------------------------------------------------


def test_posts_are_keyed_by_their_body(ca: TestCA, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    with origins(ca) as (_, secure):
        url = f"https://secure.test:{secure.port}/rpc"
        with served(ca, "record", folder) as (_, gate, port, cafile):
            assert [curl(port, cafile, url, "--data-binary", body)[2] for body in ("one", "two")] == [
                b"answer to one",
                b"answer to two",
            ]
            assert [r.cache for r in records(gate, 2)] == ["stored", "stored"]
    with served(ca, "replay", folder) as (_, gate, port, cafile):
        for body in ("two", "one"):
            assert curl(port, cafile, url, "--data-binary", body)[2] == f"answer to {body}".encode()
        assert status_of(curl(port, cafile, url, "--data-binary", "three")[1]) == 504
        assert [r.cache for r in records(gate, 3)] == ["hit", "hit", "miss"]


def test_credentials_and_cookies_are_never_stored(ca: TestCA, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    with origins(ca) as (_, secure):
        base = f"https://secure.test:{secure.port}"
        with served(ca, "record", folder) as (_, gate, port, cafile):
            assert curl(port, cafile, f"{base}/file", "-H", "Authorization: Bearer token")[2] == FILE
            assert curl(port, cafile, f"{base}/chunked", "-H", "Cookie: a=b")[0] == 0
            code, head, _ = curl(port, cafile, f"{base}/cookie")
            assert code == 0 and b"Set-Cookie: session=secret-of-the-recorder" in head  # the live client gets it
            assert [r.cache for r in records(gate, 3)] == ["passed", "passed", "stored"]
    stored = "".join(path.read_text() for path in (folder / "index").glob("*.json"))
    assert "secret-of-the-recorder" not in stored and "token" not in stored
    with served(ca, "replay", folder) as (_, gate, port, cafile):
        assert status_of(curl(port, cafile, f"{base}/file", "-H", "Authorization: Bearer token")[1]) == 504
        code, head, body = curl(port, cafile, f"{base}/cookie")
        assert (code, body) == (0, b"with a cookie") and b"Set-Cookie" not in head


def test_bodies_over_the_cap_are_passed_on_not_stored(ca: TestCA, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    capped = {"mode": "record", "dir": str(folder), "max_body_bytes": 1000}
    with origins(ca) as (_, secure), served(ca, "record", folder, cache=capped) as (_, gate, port, cafile):
        assert curl(port, cafile, f"https://secure.test:{secure.port}/file")[2] == FILE
        assert curl(port, cafile, f"https://secure.test:{secure.port}/cookie")[0] == 0
        assert [r.cache for r in records(gate, 2)] == ["passed", "stored"]
    assert list((folder / "blobs" / "sha256").iterdir()) == [
        folder / "blobs" / "sha256" / hashlib.sha256(b"with a cookie").hexdigest()
    ]
    assert list((folder / "tmp").iterdir()) == []  # the dropped body left nothing behind


def test_a_tampered_blob_is_refused_and_recorded(ca: TestCA, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    with origins(ca) as (_, secure), served(ca, "record", folder) as (_, _, port, cafile):
        url = f"https://secure.test:{secure.port}/file"
        assert curl(port, cafile, url)[2] == FILE
    blob = folder / "blobs" / "sha256" / hashlib.sha256(FILE).hexdigest()
    blob.write_bytes(b"X" + FILE[1:])
    with served(ca, "replay", folder) as (_, gate, port, cafile):
        _, head, body = curl(port, cafile, url)
        assert status_of(head) == 502 and b"corrupt" in body and FILE[1:100] not in body
        (record,) = records(gate, 1)
        assert (record.verdict, record.cache) == ("unreachable", "miss")
        assert record.error is not None and "does not match its digest" in record.error


# --- trust --------------------------------------------------------------------------------------------


def test_the_store_ca_is_private_and_trusted_only_while_caching(ca: TestCA, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    with EgressProxy(settings(ca, "record", folder)) as proxy:
        assert proxy.sandbox_ca_files == (str(ca.cert_path), str(folder / "ca" / "ca.pem"))
    assert (folder / "ca" / "ca.key").stat().st_mode & 0o777 == 0o600
    assert (folder / "ca").stat().st_mode & 0o777 == 0o700
    first = (folder / "ca" / "ca.pem").read_bytes()
    with EgressProxy(settings(ca, "replay", folder)):
        assert (folder / "ca" / "ca.pem").read_bytes() == first  # made once per store
    off = EgressSettings(extra_ca_files=(str(ca.cert_path),), cache=CacheSettings(dir=str(folder)))
    with EgressProxy(off) as proxy:
        assert proxy.sandbox_ca_files == (str(ca.cert_path),)


def test_no_silent_downgrade_when_a_side_is_not_trusted(ca: TestCA, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    with origins(ca) as (_, secure):
        url = f"https://secure.test:{secure.port}/file"
        with served(ca, "record", folder) as (_, gate, port, _):
            code, _, body = curl(port, ca.cert_path, url)  # trusts the origin's CA, not the store's
            assert code == 60 and body == b""  # curl: the peer's certificate cannot be verified
            (record,) = records(gate, 1)
            assert record.error is not None and "TLS with the client failed" in record.error
        # The proxy verifies origins against the system's CAs and extra_ca_files only.
        with served(ca, "record", folder, extra_ca_files=[]) as (_, gate, port, cafile):
            code, head, body = curl(port, cafile, url)
            assert status_of(head) == 502 and b"certificate_verify_failed" in body.lower()
            (record,) = records(gate, 1)
            assert record.verdict == "unreachable" and record.cache is None
        assert secure.seen == []
    assert list((folder / "index").iterdir()) == []


# --- settings and moving a store --------------------------------------------------------------------


def test_settings_parse_and_refuse() -> None:
    parsed = EgressSettings.parse({"cache": {"mode": "replay", "dir": "/tmp/sg-cache", "max_body_bytes": 10}})
    assert parsed.cache == CacheSettings(CacheMode.REPLAY, "/tmp/sg-cache", 10)
    assert EgressSettings.parse(parsed.as_dict()).cache == parsed.cache
    assert EgressSettings.parse({"cache": {"mode": False, "dir": None}}).cache.mode is CacheMode.OFF  # YAML's `off`
    assert not EgressSettings().cache.is_on
    with pytest.raises(ConfigError, match="unknown egress cache mode 'sometimes'; choose one of: off, record, replay"):
        EgressSettings.parse({"cache": {"mode": "sometimes", "dir": "/tmp"}})
    with pytest.raises(ConfigError, match="needs a dir"):
        EgressSettings.parse({"cache": {"mode": "record"}})
    with pytest.raises(ConfigError, match="unknown egress cache setting"):
        EgressSettings.parse({"cache": {"mode": "off", "path": "/tmp"}})


def test_export_and_import_round_trip_and_refuse_a_doctored_blob(ca: TestCA, tmp_path: Path) -> None:
    folder, tar_path = tmp_path / "cache", tmp_path / "cache.tar"
    with origins(ca) as (_, secure), served(ca, "record", folder) as (_, _, port, cafile):
        url = f"https://secure.test:{secure.port}/file"
        assert curl(port, cafile, url)[2] == FILE
        assert curl(port, cafile, f"https://secure.test:{secure.port}/cookie")[0] == 0
    assert cache_cli(["export", str(folder), str(tar_path)]) == 0
    assert export(folder, tmp_path / "again.tar") == 2

    elsewhere = tmp_path / "elsewhere"
    assert cache_cli(["import", str(tar_path), str(elsewhere)]) == 0
    assert (elsewhere / "ca" / "ca.pem").read_bytes() == (folder / "ca" / "ca.pem").read_bytes()
    assert (elsewhere / "ca" / "ca.key").stat().st_mode & 0o777 == 0o600
    with served(ca, "replay", elsewhere) as (_, _, port, cafile):
        assert curl(port, cafile, url)[2] == FILE

    doctored = tmp_path / "doctored.tar"
    with tarfile.open(tar_path) as source, tarfile.open(doctored, "w") as out:
        for member in source.getmembers():
            data = source.extractfile(member)
            content = data.read() if data is not None else b""
            if member.name.startswith("blobs/") and len(content) == len(FILE):
                content = b"X" + content[1:]
            member.size = len(content)
            out.addfile(member, io.BytesIO(content))
    fresh = tmp_path / "fresh"
    with pytest.raises(ConfigError, match="does not match its content"):
        import_(doctored, fresh)
    assert list((fresh / "index").iterdir()) == [] and list((fresh / "blobs" / "sha256").iterdir()) == []
    assert cache_cli(["import", str(doctored), str(fresh)]) == 1

    strange = tmp_path / "strange.tar"
    with tarfile.open(strange, "w") as out:
        info = tarfile.TarInfo("index/../../escape.json")
        out.addfile(info, io.BytesIO(b""))
    with pytest.raises(ConfigError, match="unexpected member"):
        import_(strange, fresh)
    assert not (tmp_path / "escape.json").exists()
    shutil.rmtree(fresh)
    entry = json.loads(next((elsewhere / "index").glob("*.json")).read_text())
    assert entry["request"]["host"] == "secure.test" and entry["body"]["size"] in (len(FILE), len(b"with a cookie"))
