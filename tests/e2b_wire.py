"""The HTTP side of the E2B stand-in (tests/e2b_standin.py): requests, replies, the error bodies,
Connect framing, multipart bodies, and the threaded server. PYTEST_DONT_REWRITE.

The control plane and envd's HTTP API (``/files``) answer errors as ``{"code": int, "message": str}``;
a Connect unary RPC answers ``{"code": str, "message": str}``, which the SDK's connectrpc parses
itself. A Connect server stream is a run of envelopes (a flags byte, a big-endian length, the JSON),
sent with chunked transfer encoding; connectrpc sends stream requests chunked too, and the handler
reads every request body to its end before it is answered.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import socket
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from http_body import read_body

_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
_CONNECT_STATUS = {
    "invalid_argument": 400,
    "unauthenticated": 401,
    "permission_denied": 403,
    "not_found": 404,
    "already_exists": 409,
    "failed_precondition": 400,
    "resource_exhausted": 429,
    "internal": 500,
    "unimplemented": 501,
    "deadline_exceeded": 504,
}


@dataclass(slots=True)
class Request:
    """One HTTP request as the stand-in reads it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    """Lower-case names."""
    body: bytes

    def json(self) -> dict[str, Any]:
        data = json.loads(self.body or b"{}")
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


def api_error(status: int, message: str) -> Reply:
    """The control plane's and envd HTTP API's error body, ``{"code": int, "message": str}``."""
    return json_reply(status, {"code": status, "message": message})


def connect_error(code: str, message: str) -> Reply:
    """A Connect unary error: a string code, which the SDK's connectrpc parses itself."""
    return json_reply(_CONNECT_STATUS.get(code, 500), {"code": code, "message": message})


def frame(message: Mapping[str, Any], *, end: bool = False) -> bytes:
    """One Connect envelope: flags (0x02 ends the stream), a big-endian length, the JSON."""
    data = json.dumps(message).encode()
    return struct.pack(">BI", 0x02 if end else 0x00, len(data)) + data


def end_stream(error: Mapping[str, str] | None = None) -> bytes:
    return frame({"error": dict(error)} if error else {}, end=True)


def first_envelope(body: bytes) -> dict[str, Any]:
    if len(body) < 5:
        raise ValueError("no Connect envelope in the request body")
    _, size = struct.unpack(">BI", body[:5])
    data = json.loads(body[5 : 5 + size])
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    return data


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def new_id() -> str:
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(20))


def multipart(content_type: str, body: bytes) -> list[tuple[str, bytes]]:
    """(filename, data) of each part of a multipart/form-data body."""
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if match is None:
        raise ValueError("multipart body without a boundary")
    parts = []
    for segment in (b"\r\n" + body).split(b"\r\n--" + match.group(1).encode())[1:]:
        if segment.startswith(b"--"):
            break
        head, _, data = segment.partition(b"\r\n\r\n")
        name = re.search(r'filename="([^"]*)"', head.decode("utf-8", "replace"))
        parts.append((unquote(name.group(1)) if name else "", data))
    return parts


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive: every reply has a Content-Length or is chunked, and every
    request body is read to its end first (connectrpc sends stream requests chunked)."""

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
        body = self._read_body()
        url = urlsplit(self.path)
        headers = {k.lower(): v for k, v in self.headers.items()}
        request = Request(self.command, url.path, dict(parse_qsl(url.query)), headers, body)
        self._send(self.server.handle(request))

    do_POST = do_DELETE = do_PUT = do_PATCH = do_GET

    def _read_body(self) -> bytes:
        return read_body(self)

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.stream is None:
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
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
