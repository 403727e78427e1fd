"""The origin servers of the tests' fake internet: run inside a network namespace by ``net_fixtures``.

``python3 internet_server.py CONFIG.json`` (stdlib only) serves, on every
address of ``config["addresses"]``:

- HTTP on port 80 and HTTPS on port 443: virtual hosts by Host header (SNI
  when there is none), each a folder of static files read at request time;
  ``/_echo`` on any host answers the request as JSON;
- a TCP echo on ``echo_port`` (7);
- a UDP sink on ``udp_port`` (53) that only records what it receives;
- an HTTP proxy on ``proxy_port`` (3129), a corporate upstream proxy's
  stand-in: CONNECT tunnels and absolute-form plain HTTP, one request per
  connection, names resolved with ``config["hosts"]``.

Every request, connection and datagram is appended as one JSON line to its log
before it is answered, so a test that got an answer can read the record at
once. Once every listener is bound, the server writes ``ready_file``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import mimetypes
import os
import select
import socket
import socketserver
import ssl
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ECHO_PATH = "/_echo"
IO_TIMEOUT_S = 30.0
RELAY_CHUNK = 65536


class JsonLog:
    """An append-only JSON-lines file; each record is one write, so readers never see half a line for long."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, **record: Any) -> None:
        line = json.dumps({"time": time.time(), **record}, sort_keys=True) + "\n"
        with self._lock:
            os.write(self._fd, line.encode())


def host_of(value: str | None) -> str | None:
    """A Host header's name, lower-cased, without the port or a trailing dot."""
    if not value:
        return None
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


# ---------------------------------------------------------------- origins (HTTP, HTTPS)


class OriginHandler(BaseHTTPRequestHandler):
    """Static files per virtual host, and ``/_echo``."""

    protocol_version = "HTTP/1.1"
    server_version = "snapgym-test-origin"
    timeout = IO_TIMEOUT_S
    server: OriginServer

    def setup(self) -> None:
        self.sni: str | None = None
        if self.server.tls is not None:
            self.request.settimeout(IO_TIMEOUT_S)
            self.request = self.server.tls.wrap_socket(self.request, server_side=True)
            self.sni = getattr(self.request, "sni", None)
        super().setup()

    def handle_any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        host = host_of(self.headers.get("Host")) or self.sni
        path = urllib.parse.urlsplit(self.path).path
        if path == ECHO_PATH:
            status, content, ctype = 200, self.echo(host, body), "application/json"
        else:
            status, content, ctype = self.static(host, path)
        self.server.log.write(
            host=host, path=self.path, method=self.command, client=self.client_address[0],
            server=self.server.address, tls=self.server.tls is not None, sni=self.sni, status=status,
        )  # fmt: skip
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(content)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = handle_any

    def echo(self, host: str | None, body: bytes) -> bytes:
        answer = {
            "method": self.command,
            "path": self.path,
            "host": self.headers.get("Host"),
            "name": host,
            "headers": dict(self.headers.items()),
            "client": f"{self.client_address[0]}:{self.client_address[1]}",
            "server": self.server.address,
            "tls": self.server.tls is not None,
            "sni": self.sni,
            "body": body.decode("utf-8", "replace"),
        }
        return json.dumps(answer, indent=1).encode()

    def static(self, host: str | None, path: str) -> tuple[int, bytes, str]:
        folder = self.server.sites.get(host or "")
        if folder is None:
            return 404, f"no site {host!r}\n".encode(), "text/plain"
        target = (folder / urllib.parse.unquote(path).lstrip("/")).resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.is_relative_to(folder.resolve()) or not target.is_file():
            return 404, b"not found\n", "text/plain"
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        return 200, target.read_bytes(), ctype

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the JSON log has it


class OriginServer(ThreadingHTTPServer):
    """One address and port of the origins; TLS is done in the request's thread, not at accept."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, address: str, port: int, sites: dict[str, Path], log: JsonLog, tls: ssl.SSLContext | None
    ) -> None:
        self.address = f"{address}:{port}"
        self.sites = sites
        self.log = log
        self.tls = tls
        super().__init__((address, port), OriginHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        print(f"{self.address}: {client_address[0]}: {sys.exc_info()[1]!r}", file=sys.stderr, flush=True)


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server context that remembers the SNI of each connection on its socket (``sock.sni``)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    def remember(sock: Any, name: str | None, _: ssl.SSLContext) -> None:
        with contextlib.suppress(AttributeError):
            sock.sni = name

    context.sni_callback = remember
    return context


# ---------------------------------------------------------------- TCP echo, UDP sink


class EchoHandler(socketserver.BaseRequestHandler):
    server: RawServer

    def handle(self) -> None:
        self.server.log.write(client=self.client_address[0], server=self.server.address, kind="tcp")
        self.request.settimeout(IO_TIMEOUT_S)
        with contextlib.suppress(OSError):
            while data := self.request.recv(RELAY_CHUNK):
                self.request.sendall(data)


class RawServer(socketserver.ThreadingTCPServer):
    """A TCP listener (echo or proxy) that knows its address and log."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: str, port: int, handler: type, log: JsonLog, hosts: dict[str, str]) -> None:
        self.address = f"{address}:{port}"
        self.log = log
        self.hosts = hosts
        super().__init__((address, port), handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        print(f"{self.address}: {client_address[0]}: {sys.exc_info()[1]!r}", file=sys.stderr, flush=True)


def udp_sink(sock: socket.socket, log: JsonLog) -> None:
    """Record every datagram (never answer: nothing from a sandbox should get here)."""
    address = "{}:{}".format(*sock.getsockname())
    while True:
        data, (client, port) = sock.recvfrom(65535)
        log.write(client=client, client_port=port, server=address, size=len(data), data=data[:512].hex())


# ---------------------------------------------------------------- upstream proxy stand-in


class ProxyHandler(socketserver.StreamRequestHandler):
    """One proxied request per connection: CONNECT tunnels, or absolute-form HTTP sent on with Connection: close."""

    rbufsize = 0  # unbuffered, so no byte after the header block is left behind in a buffer
    timeout = IO_TIMEOUT_S
    server: RawServer

    def handle(self) -> None:
        line = self.rfile.readline(8192).decode("latin-1").strip()
        headers = self.read_headers()
        method, target = [*line.split(" "), "", ""][:2]
        host, port, path = self.split_target(method, target)
        address = self.resolve(host)
        upstream = self.connect(address, port)
        self.server.log.write(
            method=method, target=target, host=host, port=port, address=address,
            client=self.client_address[0], status=200 if upstream else 502,
            proxy_authorization=headers.get("proxy-authorization", ("", None))[1],
        )  # fmt: skip
        if upstream is None:
            self.wfile.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        with upstream:
            if method == "CONNECT":
                self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                relay(self.request, upstream)
            else:
                self.forward(upstream, method, path, host, port, headers)

    def read_headers(self) -> dict[str, tuple[str, str]]:
        """Lower-cased name -> (name as sent, value)."""
        headers: dict[str, tuple[str, str]] = {}
        while (raw := self.rfile.readline(8192).decode("latin-1").strip()) and len(headers) < 200:
            name, _, value = raw.partition(":")
            headers[name.strip().lower()] = (name.strip(), value.strip())
        return headers

    @staticmethod
    def split_target(method: str, target: str) -> tuple[str, int, str]:
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            return host.strip("[]"), int(port or 443), ""
        parts = urllib.parse.urlsplit(target)
        path = parts.path or "/"
        return parts.hostname or "", parts.port or 80, path + (f"?{parts.query}" if parts.query else "")

    def resolve(self, host: str) -> str | None:
        with contextlib.suppress(ValueError):
            return str(ipaddress.ip_address(host))
        if host.lower().rstrip(".") in self.server.hosts:
            return self.server.hosts[host.lower().rstrip(".")]
        try:
            return str(socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0])
        except OSError:
            return None

    @staticmethod
    def connect(address: str | None, port: int) -> socket.socket | None:
        if address is None:
            return None
        try:
            return socket.create_connection((address, port), timeout=5)
        except OSError:
            return None

    def forward(
        self,
        upstream: socket.socket,
        method: str,
        path: str,
        host: str,
        port: int,
        headers: dict[str, tuple[str, str]],
    ) -> None:
        dropped = {"connection", "keep-alive", "proxy-connection", "proxy-authorization"}
        kept = {k: v for k, v in headers.items() if k not in dropped}
        kept.setdefault("host", ("Host", host if port == 80 else f"{host}:{port}"))
        kept["connection"] = ("Connection", "close")
        head = "".join(f"{name}: {value}\r\n" for name, value in kept.values())
        upstream.sendall(f"{method} {path} HTTP/1.1\r\n{head}\r\n".encode("latin-1"))
        length = int(headers.get("content-length", ("", "0"))[1] or 0)
        if length > 0:
            upstream.sendall(self.rfile.read(length))
        answer = upstream.makefile("rb")
        status = answer.readline(8192)
        lines = [status]
        while (raw := answer.readline(8192)) not in (b"\r\n", b"\n", b""):
            if raw.split(b":", 1)[0].strip().lower() not in (b"connection", b"keep-alive"):
                lines.append(raw)
        self.wfile.write(b"".join(lines) + b"Connection: close\r\n\r\n")
        while data := answer.read1(RELAY_CHUNK):
            self.wfile.write(data)


def relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    a.settimeout(None)
    b.settimeout(None)
    with contextlib.suppress(OSError):
        while True:
            ready, _, _ = select.select([a, b], [], [], IO_TIMEOUT_S)
            if not ready:
                return
            for src in ready:
                data = src.recv(RELAY_CHUNK)
                if not data:
                    return
                (b if src is a else a).sendall(data)


# ---------------------------------------------------------------- main


def serve(config: dict[str, Any]) -> None:
    sites = {name.lower(): Path(folder) for name, folder in config["sites"].items()}
    hosts = {name.lower(): address for name, address in config.get("hosts", {}).items()}
    logs = {kind: JsonLog(config["logs"][kind]) for kind in ("requests", "proxy", "tcp", "udp")}
    tls = tls_context(config["cert"], config["key"])
    servers: list[socketserver.BaseServer] = []
    for address in config["addresses"]:
        servers.append(OriginServer(address, config.get("http_port", 80), sites, logs["requests"], None))
        servers.append(OriginServer(address, config.get("https_port", 443), sites, logs["requests"], tls))
        servers.append(RawServer(address, config.get("echo_port", 7), EchoHandler, logs["tcp"], hosts))
        servers.append(RawServer(address, config.get("proxy_port", 3129), ProxyHandler, logs["proxy"], hosts))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind((address, config.get("udp_port", 53)))
        threading.Thread(target=udp_sink, args=(udp, logs["udp"]), daemon=True).start()
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    ready = Path(config["ready_file"])
    ready.with_suffix(".tmp").write_text(str(os.getpid()))
    ready.with_suffix(".tmp").rename(ready)
    print("READY", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    serve(json.loads(Path(sys.argv[1]).read_text()))
