"""What the HTTP stand-in servers (E2B's, Daytona's) share: a request as they read it, a reply, and a
threaded HTTP/1.1 server on 127.0.0.1 with keep-alive that hands every request to one function.

Request bodies are read to their end, by Content-Length or chunked (connectrpc and some SDK uploads
stream requests chunked, which BaseHTTPRequestHandler does not decode), which keeps keep-alive
connections in step. A reply is sent with a Content-Length, or chunked when it streams (a Connect
server stream)."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit


@dataclass(slots=True)
class Request:
    """One HTTP request as a stand-in reads it."""

    method: str
    path: str
    """As sent: path parameters are still percent-encoded (a snapshot name may hold a ``/``)."""
    query: dict[str, list[str]]
    """Every value of each parameter, blank ones included."""
    headers: dict[str, str]
    """Lower-case names."""
    body: bytes

    def arg(self, name: str, default: str | None = None) -> str | None:
        """The last value of a query parameter."""
        values = self.query.get(name)
        return values[-1] if values else default

    def json(self) -> Any:
        """The body as JSON (``{}`` when empty)."""
        return json.loads(self.body or b"{}")

    def json_object(self) -> dict[str, Any]:
        """The body as a JSON object.

        Raises:
            ValueError: the body is not a JSON object.
        """
        data = self.json()
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        return data


@dataclass(slots=True)
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    stream: Iterator[bytes] | None = None
    """Frames sent with chunked transfer encoding after the headers (a Connect server stream)."""


def json_reply(status: int, data: object, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, json.dumps(data).encode(), headers=headers or {})


def read_body(handler: BaseHTTPRequestHandler) -> bytes:
    """The request's whole body, de-chunked, trailers skipped."""
    if "chunked" not in handler.headers.get("Transfer-Encoding", "").lower():
        return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
    chunks = []
    while size := int(handler.rfile.readline(1024).split(b";")[0].strip() or b"0", 16):
        chunks.append(handler.rfile.read(size))
        handler.rfile.readline(1024)
    while handler.rfile.readline(1024).strip():  # trailers, up to the blank line
        continue
    return b"".join(chunks)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def setup(self) -> None:
        super().setup()
        self.server.connections.add(self.connection)

    def finish(self) -> None:
        self.server.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the stand-in keeps its own request log."""

    def do_GET(self) -> None:
        body = read_body(self)
        url = urlsplit(self.path)
        query: dict[str, list[str]] = {}
        for key, value in parse_qsl(url.query, keep_blank_values=True):
            query.setdefault(key, []).append(value)
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = self.server.handle(Request(self.command, url.path, query, headers, body))
        if headers.get("upgrade"):  # a refused websocket (socket.io) must not keep the connection
            self.close_connection = True
        self._send(reply)

    do_POST = do_DELETE = do_PUT = do_PATCH = do_GET

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.stream is None:
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            with contextlib.suppress(OSError):  # the client gave up (its own timeout)
                self.wfile.write(reply.body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for piece in reply.stream:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client gave up on the stream (its deadline, disconnect())
            self.close_connection = True


class Server(ThreadingHTTPServer):
    """A threaded server on 127.0.0.1 that hands every request to ``handle``."""

    daemon_threads = True

    def __init__(self, handle: Callable[[Request], Reply]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.handle = handle
        self.connections: set[socket.socket] = set()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        """Stop serving and cut idle keep-alive connections."""
        self.shutdown()
        for connection in list(self.connections):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self.server_close()
