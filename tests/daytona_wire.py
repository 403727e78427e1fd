"""The HTTP side of the Daytona stand-in (tests/daytona_standin.py): requests, replies, the error
bodies Daytona's API and daemon send, multipart bodies, and the threaded server.

Error bodies come in two shapes. The control plane (a NestJS app) answers
``{"statusCode", "message", "error", "path", "method", "timestamp"}``; the sandbox daemon answers
its ``ErrorResponse``, ``{"statusCode", "message", "code", "source": "DAYTONA_DAEMON", ...}``, whose
``code`` (``FILE_NOT_FOUND``, ``PROCESS_EXECUTION_TIMEOUT``, ...) the SDK maps to a narrower
exception than the status alone would. PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from http_body import read_body

DAEMON_SOURCE = "DAYTONA_DAEMON"
"""The ``source`` the SDK needs beside a daemon ``code`` to pick the narrower exception."""
DOWNLOAD_BOUNDARY = "DAYTONA-FILE-BOUNDARY"
"""The boundary of the daemon's bulk-download reply."""


@dataclass(slots=True)
class Request:
    """One HTTP request as the stand-in reads it."""

    method: str
    path: str
    """As sent: path parameters are still percent-encoded (a snapshot name may hold a ``/``)."""
    query: dict[str, list[str]]
    headers: dict[str, str]
    """Lower-case names."""
    body: bytes

    def arg(self, name: str, default: str | None = None) -> str | None:
        """The first value of a query parameter."""
        values = self.query.get(name)
        return values[0] if values else default

    def json(self) -> Any:
        return json.loads(self.body or b"{}")


@dataclass(slots=True)
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def json_reply(status: int, data: object, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, json.dumps(data).encode(), headers=headers or {})


def now_iso() -> str:
    return iso(datetime.now(UTC).timestamp())


def iso(t: float) -> str:
    """RFC 3339 with milliseconds, as the API writes times."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def api_error(request: Request, status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    """The control plane's error body."""
    body = {
        "statusCode": status,
        "message": message,
        "error": HTTPStatus(status).phrase,
        "path": request.path,
        "method": request.method,
        "timestamp": now_iso(),
    }
    return json_reply(status, body, headers)


def daemon_error(request: Request, status: int, message: str, code: str) -> Reply:
    """The sandbox daemon's ``ErrorResponse``."""
    return json_reply(status, daemon_error_body(status, message, code, request.path, request.method))


def daemon_error_body(status: int, message: str, code: str, path: str, method: str) -> dict[str, Any]:
    return {
        "statusCode": status,
        "message": message,
        "code": code,
        "source": DAEMON_SOURCE,
        "timestamp": now_iso(),
        "path": path,
        "method": method,
    }


@dataclass(frozen=True, slots=True)
class Part:
    """One part of a multipart/form-data body."""

    name: str
    filename: str | None
    data: bytes


def parse_multipart(content_type: str, body: bytes) -> list[Part]:
    """The parts of a multipart/form-data body, in order."""
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if match is None:
        raise ValueError("multipart body without a boundary")
    parts = []
    for segment in (b"\r\n" + body).split(b"\r\n--" + match.group(1).encode())[1:]:
        if segment.startswith(b"--"):
            break
        head, _, data = segment.partition(b"\r\n\r\n")
        disposition = head.decode("utf-8", "replace")
        name = re.search(r'\bname="([^"]*)"', disposition)
        filename = re.search(r'\bfilename="([^"]*)"', disposition)
        parts.append(Part(name.group(1) if name else "", unquote(filename.group(1)) if filename else None, data))
    return parts


def multipart_part(name: str, path: str, content_type: str, data: bytes) -> bytes:
    """One part of the daemon's bulk-download reply, named by the path it answers for."""
    latin = "".join(c if 0x20 <= ord(c) <= 0xFF and c != "\x7f" else "_" for c in path)
    latin = latin.replace("\\", "\\\\").replace('"', '\\"')
    disposition = f'form-data; name="{name}"; filename="{latin}"; filename*=utf-8\'\'{quote(path, safe="")}'
    head = (
        f"--{DOWNLOAD_BOUNDARY}\r\nContent-Type: {content_type}\r\nContent-Disposition: {disposition}\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode("latin-1") + data + b"\r\n"


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive; every reply has a Content-Length."""

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
        query: dict[str, list[str]] = {}
        for key, value in parse_qsl(url.query, keep_blank_values=True):
            query.setdefault(key, []).append(value)
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = self.server.handle(Request(self.command, url.path, query, headers, body))
        if headers.get("upgrade"):  # a refused websocket (socket.io) must not keep the connection
            self.close_connection = True
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the client gave up (its own timeout)
            self.wfile.write(reply.body)

    do_POST = do_DELETE = do_PUT = do_PATCH = do_GET

    def _read_body(self) -> bytes:
        return read_body(self)


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
