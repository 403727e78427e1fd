"""The HTTP side of the Daytona stand-in (tests/backends/cloud/daytona/standin.py): requests, replies, the error
bodies Daytona's API and daemon send, and multipart bodies (requests, replies and the threaded
server are shared with E2B's: tests/backends/cloud/http_standin.py).

Error bodies come in two shapes. The control plane (a NestJS app) answers
``{"statusCode", "message", "error", "path", "method", "timestamp"}``; the sandbox daemon answers
its ``ErrorResponse``, ``{"statusCode", "message", "code", "source": "DAYTONA_DAEMON", ...}``, whose
``code`` (``FILE_NOT_FOUND``, ``PROCESS_EXECUTION_TIMEOUT``, ...) the SDK maps to a narrower
exception than the status alone would. PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any
from urllib.parse import quote, unquote

from tests.backends.cloud.http_standin import Reply, Request, json_reply

DAEMON_SOURCE = "DAYTONA_DAEMON"
"""The ``source`` the SDK needs beside a daemon ``code`` to pick the narrower exception."""
DOWNLOAD_BOUNDARY = "DAYTONA-FILE-BOUNDARY"
"""The boundary of the daemon's bulk-download reply."""


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
