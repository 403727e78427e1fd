"""The HTTP side of the E2B stand-in (tests/backends/cloud/e2b/standin.py): requests, replies, the error bodies,
Connect framing and multipart bodies (requests, replies and the threaded server are shared with
Daytona's: tests/backends/cloud/http_standin.py). PYTEST_DONT_REWRITE.

The control plane and envd's HTTP API (``/files``) answer errors as ``{"code": int, "message": str}``;
a Connect unary RPC answers ``{"code": str, "message": str}``, which the SDK's connectrpc parses
itself. A Connect server stream is a run of envelopes (a flags byte, a big-endian length, the JSON),
sent with chunked transfer encoding; connectrpc sends stream requests chunked too, and the handler
reads every request body to its end before it is answered.
"""

from __future__ import annotations

import json
import re
import secrets
import struct
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from tests.backends.cloud.http_standin import Reply, json_reply

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
