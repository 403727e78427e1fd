"""A local stand-in for the E2B service, spoken to by the real, unmodified ``e2b`` SDK (2.63).

One ``ThreadingHTTPServer`` on ``127.0.0.1`` serves both halves of E2B: the control plane
(``/v2/sandboxes``, ``/sandboxes/{id}/...``, ``/snapshots``, ``/templates/{id}``, checked against
``X-API-KEY``) and envd (``/process.Process/Start``, ``/filesystem.Filesystem/*``, ``/files``,
``/health``, checked against the sandbox's ``X-Access-Token``). The SDK is pointed at it with
``api_url=URL, sandbox_url=URL`` (:attr:`E2BStandin.sdk_options`); with ``sandbox_url`` set it sends
every sandbox's envd calls to that one URL and names the sandbox in an ``E2b-Sandbox-Id`` header,
which is how this server routes them. Plain ``http://`` makes the SDK speak HTTP/1.1.

Every E2B sandbox is a snapgym local sandbox (``pool.LocalBackend``): commands and file calls run
inside it, never on the host. Template ``"base"`` is :data:`BASE_TEMPLATE` (the host userland,
read-only, under a writable layer; workdir ``/home/user``); a snapshot (``create_snapshot``) is a
local snapshot, and ``Sandbox.create(template=<snapshot id or name>)`` starts from it.

Known differences from E2B: commands run as root whatever ``user`` says (only ``HOME``, ``USER``
and the default cwd follow the user); output is buffered and sent when the command ends, stdout
before stderr; ``stdin=True`` gives the command an empty stdin (no ``SendInput``); snapshots,
forks and pauses keep files only, never processes; ``allow_internet_access`` and ``network`` are
recorded, not enforced (local sandboxes have no network); files belong to root; no PTY, watch, signals or process
list. Tests inject faults with :meth:`E2BStandin.fail_next` and read what was asked of it in
:attr:`E2BStandin.requests` and :attr:`E2BStandin.commands`.

Test modules load it with ``pytest_plugins = ["e2b_standin"]``, which gives them the
function-scoped ``e2b_standin`` fixture over the session's local backend, and import its names.
It has no asserts of its own (PYTEST_DONT_REWRITE: test modules import it before pytest could
rewrite it).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import gzip
import itertools
import json
import posixpath
import re
import secrets
import shlex
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import pytest
from e2b import ApiParams

from pool import CommandRejectedError, FileOperationError, LocalBackend, Snapshot, Template
from pool.backends.local import LocalSandbox

BASE_TEMPLATE = Template(name="e2b-standin-base", workdir="/home/user")
"""What template ``"base"`` is: E2B's default user's home over the host userland."""
ENVD_VERSION = "0.6.7"
"""The envd version the stand-in advertises (octet-stream uploads, file metadata, no default user sent)."""
API_KEY_MARKER = "<api-key>"
"""What the request and command logs show in place of the API key."""
DEFAULT_USER = "user"
CLIENT_ID = "e2b-standin"
MAX_FORKS = 20
_OUTPUT_CHUNK = 32 * 1024
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
_FS_OPS = {"Stat": "stat", "ListDir": "list", "MakeDir": "mkdir", "Remove": "remove", "Move": "move"}


# -- what tests see ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request the stand-in answered."""

    method: str
    path: str
    """The path without the query."""
    query: dict[str, str]
    headers: dict[str, str]
    """Lower-case names; the API key, wherever it occurs, replaced by :data:`API_KEY_MARKER`."""
    status: int
    """The status answered (an injected fault's, if one matched)."""
    sandbox_id: str | None
    """The ``E2b-Sandbox-Id`` header of an envd call, else None."""

    @property
    def is_envd(self) -> bool:
        """True for a call to a sandbox's envd rather than the control plane."""
        return self.sandbox_id is not None


@dataclass(frozen=True, slots=True)
class CommandRecord:
    """One command envd ran in a local sandbox."""

    sandbox_id: str
    command: str
    """The shell line run, e.g. ``/bin/bash -l -c 'echo hi'``."""
    env: dict[str, str]
    """The variables added for it (the API key replaced by :data:`API_KEY_MARKER`)."""
    cwd: str
    user: str
    timeout_s: float | None
    exit_code: int
    timed_out: bool


@dataclass(frozen=True, slots=True)
class SandboxRecord:
    """An E2B sandbox as the stand-in knows it, live or not."""

    sandbox_id: str
    template_id: str
    metadata: dict[str, str]
    envs: dict[str, str]
    started_at: float
    end_at: float
    """Unix time the lifetime ends (the reaper kills, or with ``autoPause`` pauses, past it)."""
    state: str
    """``running``, ``paused`` or ``killed``."""
    ended_by: str | None = None
    """What killed it: ``api`` (kill), ``timeout`` (the reaper) or ``close`` (the stand-in closed)."""
    network: tuple[dict[str, Any], ...] = ()
    """The egress settings as sent, oldest first: the create's ``allow_internet_access`` and ``network``
    fields, then each ``update_network`` body (recorded, not enforced: the local sandboxes have loopback only)."""


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """A snapshot made by ``create_snapshot``."""

    snapshot_id: str
    names: list[str]
    sandbox_id: str
    """The sandbox it was taken of."""
    local: Snapshot


@dataclass(slots=True)
class _Fault:
    method: str
    path_prefix: str
    status: int
    remaining: int
    retry_after: int | None
    should_retry: bool | None
    after: bool


@dataclass(slots=True)
class _Box:
    """A sandbox's mutable state, guarded by the stand-in's lock."""

    record: SandboxRecord
    token: str
    alias: str | None
    auto_pause: bool
    local: LocalSandbox | None
    paused: Snapshot | None = None


# -- the wire -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, Any]:
        data = json.loads(self.body or b"{}")
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        return data


@dataclass(slots=True)
class _Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    stream: Iterator[bytes] | None = None
    """Frames sent with chunked transfer encoding after the headers (a Connect server stream)."""


def _json(status: int, data: object, headers: dict[str, str] | None = None) -> _Reply:
    return _Reply(status, json.dumps(data).encode(), headers=headers or {})


def _error(status: int, message: str) -> _Reply:
    """The control plane's and envd HTTP API's error body, ``{"code": int, "message": str}``."""
    return _json(status, {"code": status, "message": message})


def _connect_error(code: str, message: str) -> _Reply:
    """A Connect unary error: a string code, which the SDK's connectrpc parses itself."""
    return _json(_CONNECT_STATUS.get(code, 500), {"code": code, "message": message})


def _frame(message: Mapping[str, Any], *, end: bool = False) -> bytes:
    """One Connect envelope: flags (0x02 ends the stream), a big-endian length, the JSON."""
    data = json.dumps(message).encode()
    return struct.pack(">BI", 0x02 if end else 0x00, len(data)) + data


def _end_stream(error: Mapping[str, str] | None = None) -> bytes:
    return _frame({"error": dict(error)} if error else {}, end=True)


def _first_envelope(body: bytes) -> dict[str, Any]:
    if len(body) < 5:
        raise ValueError("no Connect envelope in the request body")
    _, size = struct.unpack(">BI", body[:5])
    data = json.loads(body[5 : 5 + size])
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    return data


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _new_id() -> str:
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(20))


def _multipart(content_type: str, body: bytes) -> list[tuple[str, bytes]]:
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
    server: _Server

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
        request = _Request(self.command, url.path, dict(parse_qsl(url.query)), headers, body)
        self._send(self.server.standin.handle(request))

    do_POST = do_DELETE = do_PUT = do_PATCH = do_GET

    def _read_body(self) -> bytes:
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        chunks = []
        while size := int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline(1024)
        while self.rfile.readline(1024).strip():  # trailers, up to the blank line
            pass
        return b"".join(chunks)

    def _send(self, reply: _Reply) -> None:
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


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, standin: E2BStandin) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.standin = standin
        self.connections: set[socket.socket] = set()


# -- the stand-in ---------------------------------------------------------------------------


class E2BStandin:
    """The E2B control plane and envd over local sandboxes; see the module docstring.

    Args:
        backend: the local backend whose sandboxes play E2B's.
        api_key: the key every control-plane request must carry (default: a random one).
        default_timeout_s: a sandbox's lifetime when create does not say (E2B's 300 s).
        reap_interval_s: how often the reaper looks for sandboxes past their lifetime.
        max_creates_per_s: answer 429 to creates (and forks) past this many in the last second.
        rate_limit_retry_after_s: the ``Retry-After`` of that 429 (None: no header).
    """

    def __init__(
        self,
        backend: LocalBackend,
        *,
        api_key: str | None = None,
        default_timeout_s: int = 300,
        reap_interval_s: float = 0.1,
        max_creates_per_s: float | None = None,
        rate_limit_retry_after_s: int | None = 1,
    ) -> None:
        self.backend = backend
        self.api_key = api_key or f"e2b_{secrets.token_hex(20)}"
        self.default_timeout_s = default_timeout_s
        self.max_creates_per_s = max_creates_per_s
        self.rate_limit_retry_after_s = rate_limit_retry_after_s
        self.base_snapshot = backend.build(BASE_TEMPLATE)
        self._templates: dict[str, tuple[str, Snapshot]] = {"base": (_new_id(), self.base_snapshot)}
        """Template name -> its id and snapshot."""
        self._lock = threading.RLock()
        self._create_lock = threading.Lock()
        self._boxes: dict[str, _Box] = {}
        self._snapshots: dict[str, SnapshotRecord] = {}
        self._idempotent: dict[str, str] = {}
        self._faults: list[_Fault] = []
        self._requests: list[RequestRecord] = []
        self._commands: list[CommandRecord] = []
        self._create_times: list[float] = []
        self._created = 0
        self._pids = itertools.count(1000)
        self._closed = False
        self._routes: list[tuple[str, re.Pattern[str], Callable[..., _Reply]]] = [
            ("POST", re.compile(r"/v2/sandboxes"), self._create),
            ("GET", re.compile(r"/v2/sandboxes"), self._list),
            ("GET", re.compile(r"/sandboxes/([^/]+)"), self._info),
            ("DELETE", re.compile(r"/sandboxes/([^/]+)"), self._kill),
            ("POST", re.compile(r"/sandboxes/([^/]+)/timeout"), self._set_timeout),
            ("PUT", re.compile(r"/sandboxes/([^/]+)/network"), self._update_network),
            ("POST", re.compile(r"/sandboxes/([^/]+)/snapshots"), self._create_snapshot),
            ("POST", re.compile(r"/sandboxes/([^/]+)/fork"), self._fork),
            ("POST", re.compile(r"/sandboxes/([^/]+)/pause"), self._pause),
            ("POST", re.compile(r"/v2/sandboxes/([^/]+)/connect"), self._connect),
            ("GET", re.compile(r"/sandboxes/([^/]+)/metrics"), lambda req, sid: _json(200, [])),
            ("GET", re.compile(r"/snapshots"), self._list_snapshots),
            ("DELETE", re.compile(r"/templates/([^/]+)"), self._delete_snapshot),
        ]
        self._server = _Server(self)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._server.serve_forever, args=(0.05,), name="e2b-standin", daemon=True),
            threading.Thread(target=self._reap_loop, args=(reap_interval_s,), name="e2b-standin-reaper", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    # -- for tests ---------------------------------------------------------------------------

    @property
    def sdk_options(self) -> ApiParams:
        """``Sandbox.create(**standin.sdk_options)``: the key and both URLs."""
        return {"api_key": self.api_key, "api_url": self.url, "sandbox_url": self.url}

    @property
    def sdk_env(self) -> dict[str, str]:
        """The same as environment variables, for an SDK client in another process."""
        return {"E2B_API_KEY": self.api_key, "E2B_API_URL": self.url, "E2B_SANDBOX_URL": self.url}

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request answered so far, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def commands(self) -> list[CommandRecord]:
        """Every command envd ran so far, oldest first."""
        with self._lock:
            return list(self._commands)

    @property
    def created_count(self) -> int:
        """Sandboxes started by create and fork (an idempotent replay or a resume starts none)."""
        with self._lock:
            return self._created

    def sandboxes(self) -> dict[str, SandboxRecord]:
        """Every sandbox ever created, by id, killed ones included."""
        with self._lock:
            return {sid: box.record for sid, box in self._boxes.items()}

    def snapshots(self) -> dict[str, SnapshotRecord]:
        """Every snapshot not deleted, by id."""
        with self._lock:
            return dict(self._snapshots)

    def add_template(self, name: str, template: Template | Snapshot) -> Snapshot:
        """Make ``name`` a template ``Sandbox.create(template=name)`` can start from."""
        snapshot = self.backend.build(template) if isinstance(template, Template) else template
        with self._lock:
            self._templates[name] = (_new_id(), snapshot)
        return snapshot

    def fail_next(
        self,
        method: str,
        path_prefix: str,
        status: int,
        count: int = 1,
        retry_after: int | None = None,
        *,
        should_retry: bool | None = None,
        after: bool = False,
    ) -> None:
        """Answer the next ``count`` requests matching ``method`` (``"*"``: any) and ``path_prefix``
        with ``status`` and a JSON error body.

        Args:
            retry_after: send ``Retry-After`` with this many seconds.
            should_retry: send ``Should-Retry: true``/``false`` (which the SDK obeys over the status).
            after: carry the request out first and lose its answer (a create that happened,
                whose 201 never arrived).
        """
        with self._lock:
            self._faults.append(_Fault(method.upper(), path_prefix, status, count, retry_after, should_retry, after))

    def clear_faults(self) -> None:
        """Forget the faults :meth:`fail_next` queued that have not struck yet."""
        with self._lock:
            self._faults.clear()

    def close(self) -> None:
        """Stop serving and kill every sandbox. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._server.shutdown()
        for connection in list(self._server.connections):  # idle keep-alive connections
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        with self._lock:
            boxes = list(self._boxes.values())
        for box in boxes:
            self._end(box, "close")
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> E2BStandin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- dispatch ----------------------------------------------------------------------------

    def handle(self, request: _Request) -> _Reply:
        """Answer one request (called by the HTTP handler's threads)."""
        reply = self._take_fault(request, after=False)
        if reply is None:
            try:
                reply = self._route(request)
            except (ValueError, KeyError, TypeError) as exc:  # a body that is not what the route expects
                reply = _error(400, f"bad request: {exc!r}")
            except Exception as exc:  # a stand-in or backend failure: say so rather than drop the connection
                reply = _error(500, f"the stand-in failed: {exc!r}")
            if (lost := self._take_fault(request, after=True)) is not None:
                for _ in reply.stream or ():
                    pass
                reply = lost
        self._log(request, reply.status)
        return reply

    def _route(self, request: _Request) -> _Reply:
        if _is_envd(request.path):
            return self._envd(request)
        if request.headers.get("x-api-key") != self.api_key:
            return _error(401, "Invalid API key, it must start with 'e2b_' and be valid")
        for method, pattern, handler in self._routes:
            match = pattern.fullmatch(request.path)
            if match and method == request.method:
                return handler(request, *(unquote(group) for group in match.groups()))
        return _error(404, f"no route {request.method} {request.path}")

    def _take_fault(self, request: _Request, *, after: bool) -> _Reply | None:
        with self._lock:
            for fault in self._faults:
                if (
                    fault.after == after
                    and fault.method in ("*", request.method)
                    and request.path.startswith(fault.path_prefix)
                ):
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                    headers = {}
                    if fault.retry_after is not None:
                        headers["Retry-After"] = str(fault.retry_after)
                    if fault.should_retry is not None:
                        headers["Should-Retry"] = "true" if fault.should_retry else "false"
                    return _json(fault.status, {"code": fault.status, "message": "injected fault"}, headers)
        return None

    def _log(self, request: _Request, status: int) -> None:
        headers = {name: self._redact(value) for name, value in request.headers.items()}
        sandbox_id = request.headers.get("e2b-sandbox-id", "") if _is_envd(request.path) else None
        record = RequestRecord(request.method, request.path, dict(request.query), headers, status, sandbox_id)
        with self._lock:
            self._requests.append(record)

    def _redact(self, value: str) -> str:
        return value.replace(self.api_key, API_KEY_MARKER)

    # -- control plane -----------------------------------------------------------------------

    def _create(self, request: _Request) -> _Reply:
        body = request.json()
        key = request.headers.get("idempotency-key")
        with self._create_lock:
            with self._lock:
                if key in self._idempotent:
                    return _json(201, self._created_json(self._boxes[self._idempotent[key]]))
            if self._rate_limited(1) < 1:
                return self._rate_limit_reply()
            name = str(body.get("templateID") or "base")
            found = self._resolve_template(name)
            if found is None:
                return _error(404, f"template '{name}' not found")
            snapshot, template_id, alias = found
            box = self._open(
                self.backend.create(snapshot),
                template_id=template_id,
                alias=alias,
                timeout_s=body.get("timeout"),
                metadata=body.get("metadata") or {},
                envs=body.get("envVars") or {},
                auto_pause=bool(body.get("autoPause")),
            )
            sent = {k: body[k] for k in ("allow_internet_access", "network") if k in body}
            with self._lock:
                box.record = replace(box.record, network=(sent,))
                if key:
                    self._idempotent[key] = box.record.sandbox_id
        return _json(201, self._created_json(box))

    def _list(self, request: _Request) -> _Reply:
        states = set((request.query.get("state") or "running,paused").split(","))
        wanted = {unquote(k): unquote(v) for k, v in parse_qsl(request.query.get("metadata", ""))}
        template = request.query.get("template")
        with self._lock:
            boxes = [
                box
                for box in self._boxes.values()
                if box.record.state in states
                and all(box.record.metadata.get(k) == v for k, v in wanted.items())
                and template in (None, box.record.template_id, box.alias)
            ]
        boxes.sort(key=lambda b: b.record.started_at, reverse=request.query.get("order") == "desc")
        start = int(request.query.get("nextToken") or 0)
        limit = int(request.query.get("limit") or 100)
        page = boxes[start : start + limit]
        more = {"x-next-token": str(start + limit)} if start + limit < len(boxes) else {}
        return _json(200, [self._info_json(box, detail=False) for box in page], more)

    def _info(self, request: _Request, sandbox_id: str) -> _Reply:
        box = self._live_box(sandbox_id)
        if box is None:
            return _error(404, f"sandbox '{sandbox_id}' not found")
        return _json(200, self._info_json(box, detail=True))

    def _kill(self, request: _Request, sandbox_id: str) -> _Reply:
        box = self._live_box(sandbox_id)
        if box is None:
            return _error(404, f"sandbox '{sandbox_id}' not found")
        self._end(box, "api")
        return _Reply(204)

    def _set_timeout(self, request: _Request, sandbox_id: str) -> _Reply:
        timeout_s = int(request.json()["timeout"])
        with self._lock:
            box = self._live_box(sandbox_id)
            if box is None:
                return _error(404, f"sandbox '{sandbox_id}' not found")
            box.record = replace(box.record, end_at=time.time() + timeout_s)
        return _Reply(204)

    def _update_network(self, request: _Request, sandbox_id: str) -> _Reply:
        with self._lock:
            box = self._live_box(sandbox_id)
            if box is None:
                return _error(404, f"sandbox '{sandbox_id}' not found")
            box.record = replace(box.record, network=(*box.record.network, request.json()))
        return _Reply(204)

    def _create_snapshot(self, request: _Request, sandbox_id: str) -> _Reply:
        name = request.json().get("name")
        box = self._live_box(sandbox_id)
        if box is None:
            return _error(404, f"sandbox '{sandbox_id}' not found")
        local = box.local.snapshot() if box.local is not None else box.paused
        if local is None:
            return _error(409, f"sandbox '{sandbox_id}' is being paused")
        with self._lock:
            same_name = [s for s in self._snapshots.values() if name and name in s.names]
            snapshot_id = same_name[0].snapshot_id if same_name else _new_id()
            record = SnapshotRecord(snapshot_id, [name] if name else [], sandbox_id, local)
            self._snapshots[snapshot_id] = record
        return _json(201, {"snapshotID": snapshot_id, "names": record.names})

    def _list_snapshots(self, request: _Request) -> _Reply:
        sandbox_id, name = request.query.get("sandboxID"), request.query.get("name")
        with self._lock:
            found = [
                s
                for s in self._snapshots.values()
                if sandbox_id in (None, s.sandbox_id) and name in (None, s.snapshot_id, *s.names)
            ]
        start = int(request.query.get("nextToken") or 0)
        limit = int(request.query.get("limit") or 100)
        more = {"x-next-token": str(start + limit)} if start + limit < len(found) else {}
        page = [{"snapshotID": s.snapshot_id, "names": s.names} for s in found[start : start + limit]]
        return _json(200, page, more)

    def _delete_snapshot(self, request: _Request, template_id: str) -> _Reply:
        with self._lock:
            for s in list(self._snapshots.values()):
                if template_id in (s.snapshot_id, *s.names):
                    del self._snapshots[s.snapshot_id]
                    return _Reply(204)
        return _error(404, f"template '{template_id}' not found")

    def _fork(self, request: _Request, sandbox_id: str) -> _Reply:
        body = request.json()
        count = int(body.get("count") or 1)
        if not 1 <= count <= MAX_FORKS:
            return _error(400, f"count must be between 1 and {MAX_FORKS}")
        source = self._live_box(sandbox_id)
        if source is None or source.local is None:
            return _error(404, f"sandbox '{sandbox_id}' not found")
        with self._create_lock:
            allowed = self._rate_limited(count)
            locals_ = self.backend.fork(source.local.snapshot(), allowed) if allowed else []
            results: list[dict[str, Any]] = []
            for local in locals_:
                box = self._open(
                    local,
                    template_id=source.record.template_id,
                    alias=source.alias,
                    timeout_s=body.get("timeout"),
                    metadata=source.record.metadata,
                    envs=source.record.envs,
                    auto_pause=source.auto_pause,
                )
                results.append({"sandbox": self._created_json(box)})
        refused = {"error": {"code": 429, "message": "rate limit exceeded"}}
        return _json(201, results + [refused] * (count - allowed))

    def _pause(self, request: _Request, sandbox_id: str) -> _Reply:
        box = self._live_box(sandbox_id)
        if box is None:
            return _error(404, f"sandbox '{sandbox_id}' not found")
        return _Reply(204) if self._pause_box(box) else _error(409, f"sandbox '{sandbox_id}' is already paused")

    def _connect(self, request: _Request, sandbox_id: str) -> _Reply:
        timeout_s = request.json().get("timeout")
        box = self._live_box(sandbox_id)
        if box is None:
            return _error(404, f"sandbox '{sandbox_id}' not found")
        with self._lock:
            paused = box.paused if box.local is None else None
            resumed = paused is not None
            if paused is not None:
                box.local, box.paused = self.backend.create(paused), None
                end_at = time.time() + (timeout_s or self.default_timeout_s)
                box.record = replace(box.record, state="running", end_at=end_at)
            elif timeout_s:
                box.record = replace(box.record, end_at=max(box.record.end_at, time.time() + timeout_s))
        return _json(201 if resumed else 200, self._created_json(box))

    # -- sandbox lifecycle -------------------------------------------------------------------

    def _resolve_template(self, name: str) -> tuple[Snapshot, str, str | None] | None:
        """The snapshot, template id and alias (name) that ``templateID`` names, or None."""
        with self._lock:
            for alias, (template_id, snapshot) in self._templates.items():
                if name in (alias, template_id):
                    return snapshot, template_id, alias
            for s in self._snapshots.values():
                if name in (s.snapshot_id, *s.names):
                    return s.local, s.snapshot_id, s.names[0] if s.names else None
        return None

    def _rate_limited(self, wanted: int) -> int:
        """How many of ``wanted`` sandboxes may start now (and count them as started)."""
        now = time.monotonic()
        with self._lock:
            self._create_times = [t for t in self._create_times if now - t < 1.0]
            room = wanted
            if self.max_creates_per_s is not None:
                room = max(0, min(wanted, int(self.max_creates_per_s) - len(self._create_times)))
            self._create_times.extend([now] * room)
            return room

    def _rate_limit_reply(self) -> _Reply:
        retry = self.rate_limit_retry_after_s
        headers = {"Retry-After": str(retry)} if retry is not None else {}
        return _json(429, {"code": 429, "message": "rate limit exceeded"}, headers)

    def _open(
        self,
        local: LocalSandbox,
        *,
        template_id: str,
        alias: str | None,
        timeout_s: int | None,
        metadata: Mapping[str, str],
        envs: Mapping[str, str],
        auto_pause: bool,
    ) -> _Box:
        now = time.time()
        record = SandboxRecord(
            sandbox_id=_new_id(),
            template_id=template_id,
            metadata=dict(metadata),
            envs=dict(envs),
            started_at=now,
            end_at=now + (timeout_s if timeout_s is not None else self.default_timeout_s),
            state="running",
        )
        box = _Box(record, token=secrets.token_urlsafe(24), alias=alias, auto_pause=auto_pause, local=local)
        with self._lock:
            self._boxes[record.sandbox_id] = box
            self._created += 1
        return box

    def _live_box(self, sandbox_id: str) -> _Box | None:
        with self._lock:
            box = self._boxes.get(sandbox_id)
            return box if box is not None and box.record.state != "killed" else None

    def _end(self, box: _Box, ended_by: str) -> None:
        with self._lock:
            if box.record.state == "killed":
                return
            local, box.local, box.paused = box.local, None, None
            box.record = replace(box.record, state="killed", ended_by=ended_by)
        if local is not None:
            local.close()

    def _pause_box(self, box: _Box) -> bool:
        """Keep the files of a running sandbox and end it (False: it is not running)."""
        with self._lock:
            local = box.local
            if local is None:
                return False
            box.local = None
        snapshot = local.snapshot()
        local.close()
        with self._lock:
            if box.record.state == "running":  # not killed meanwhile
                box.paused = snapshot
                box.record = replace(box.record, state="paused")
        return True

    def _reap_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            now = time.time()
            with self._lock:
                due = [b for b in self._boxes.values() if b.record.state == "running" and b.record.end_at <= now]
            for box in due:
                with contextlib.suppress(Exception):  # the reaper must outlive a sandbox that fails to close
                    if not (box.auto_pause and self._pause_box(box)):
                        self._end(box, "timeout")

    def _created_json(self, box: _Box) -> dict[str, Any]:
        return {
            "templateID": box.record.template_id,
            "sandboxID": box.record.sandbox_id,
            "clientID": CLIENT_ID,
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": box.token,
            "alias": box.alias,
            "domain": None,
        }

    def _info_json(self, box: _Box, *, detail: bool) -> dict[str, Any]:
        info = {
            "templateID": box.record.template_id,
            "sandboxID": box.record.sandbox_id,
            "clientID": CLIENT_ID,
            "alias": box.alias,
            "startedAt": _rfc3339(box.record.started_at),
            "endAt": _rfc3339(box.record.end_at),
            "cpuCount": 1,
            "memoryMB": self.backend.memory_limit_mb or 512,
            "diskSizeMB": self.backend.disk_limit_mb,
            "state": box.record.state,
            "envdVersion": ENVD_VERSION,
            "metadata": box.record.metadata,
        }
        if detail:
            info["envdAccessToken"] = box.token
        return info

    # -- envd --------------------------------------------------------------------------------

    def _envd(self, request: _Request) -> _Reply:
        sandbox_id = request.headers.get("e2b-sandbox-id", "")
        box = self._live_box(sandbox_id)
        local = box.local if box is not None else None
        if box is None or local is None:  # what E2B's proxy answers for a sandbox that is gone
            return _error(502, f"The sandbox {sandbox_id} was not found")
        if request.headers.get("x-access-token") != box.token:
            return _error(401, "unauthorized access, please provide a valid access token")
        if request.path == "/health":
            return _Reply(204)
        if request.path == "/files":
            return self._files(box, local, request)
        if request.path == "/process.Process/Start":
            return self._start(box, local, request)
        service, _, method = request.path.lstrip("/").partition("/")
        if service == "filesystem.Filesystem" and method in _FS_OPS:
            return self._filesystem(local, _FS_OPS[method], request)
        return _connect_error("unimplemented", f"{request.path} is not implemented by the stand-in")

    def _start(self, box: _Box, local: LocalSandbox, request: _Request) -> _Reply:
        start = _first_envelope(request.body)
        if start.get("pty"):
            return _connect_error("unimplemented", "the stand-in has no PTY")
        process = start.get("process") or {}
        user = _user(request)
        command = shlex.join([process.get("cmd", ""), *process.get("args", [])])
        cwd = _resolve(process["cwd"], user) if process.get("cwd") else _home(user)
        env = {"HOME": _home(user), "USER": user, "LOGNAME": user, **box.record.envs, **process.get("envs", {})}
        timeout_ms = int(request.headers.get("connect-timeout-ms") or 0)
        run = _Run(box.record.sandbox_id, command, env, cwd, user, timeout_ms / 1000 if timeout_ms else None)
        stream = self._run(local, run, next(self._pids))
        return _Reply(200, content_type="application/connect+json", stream=stream)

    def _run(self, local: LocalSandbox, run: _Run, pid: int) -> Iterator[bytes]:
        yield _frame({"event": {"start": {"pid": pid}}})
        try:
            result = local.exec(run.command, timeout_s=run.timeout_s, cwd=run.cwd, env=run.env)
        except CommandRejectedError as exc:
            yield _end_stream({"code": "invalid_argument", "message": str(exc)})
            return
        except Exception as exc:  # killed or crashed under the command
            gone = self._live_box(run.sandbox_id) is None
            message = f"The sandbox {run.sandbox_id} was not found" if gone else f"{type(exc).__name__}: {exc}"
            yield _end_stream({"code": "unavailable" if gone else "internal", "message": message})
            return
        env = {k: self._redact(v) for k, v in run.env.items()}
        record = CommandRecord(
            run.sandbox_id, run.command, env, run.cwd, run.user, run.timeout_s, result.exit_code, result.timed_out
        )
        with self._lock:
            self._commands.append(record)
        for stream, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            data = text.encode()
            for i in range(0, len(data), _OUTPUT_CHUNK):
                chunk = base64.b64encode(data[i : i + _OUTPUT_CHUNK]).decode()
                yield _frame({"event": {"data": {stream: chunk}}})
        if result.timed_out:
            yield _end_stream({"code": "deadline_exceeded", "message": f"the command ran past {run.timeout_s} s"})
            return
        end = {"exitCode": result.exit_code, "exited": True, "status": f"exit status {result.exit_code}"}
        yield _frame({"event": {"end": end}})
        yield _end_stream()

    def _filesystem(self, local: LocalSandbox, op: str, request: _Request) -> _Reply:
        args = request.json()
        user = _user(request)
        for key in ("path", "source", "destination"):
            if key in args:
                args[key] = _resolve(args[key], user)
        result = local.exec(f"python3 -I -S -c {shlex.quote(_FS_SCRIPT)}", stdin=json.dumps({"op": op, **args}))
        try:
            answer = json.loads(result.stdout)
        except ValueError:
            return _connect_error("internal", f"the filesystem helper failed: {result.stderr.strip()}")
        if "ok" in answer:
            return _json(200, answer["ok"])
        return _connect_error(answer["code"], answer["message"])

    def _files(self, box: _Box, local: LocalSandbox, request: _Request) -> _Reply:
        user = request.query.get("username") or DEFAULT_USER
        if request.method == "GET":
            if not request.query.get("path"):
                return _error(400, "path is required")
            try:
                data = local.read_file(_resolve(request.query["path"], user))
            except FileOperationError as exc:
                return _file_error(exc)
            return _Reply(200, data, "application/octet-stream")
        content_type = request.headers.get("content-type", "")
        body = request.body
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if content_type.startswith("multipart/form-data"):
            uploads = _multipart(content_type, body)
            if len(uploads) == 1 and request.query.get("path"):
                uploads = [(request.query["path"], uploads[0][1])]
        elif request.query.get("path"):
            uploads = [(request.query["path"], body)]
        else:
            return _error(400, "path is required")
        written = []
        for path, data in uploads:
            target = _resolve(path, user)
            try:
                local.write_file(target, data)
            except FileOperationError as exc:
                return _file_error(exc)
            written.append({"name": posixpath.basename(target), "type": "file", "path": target})
        return _json(200, written)


@dataclass(frozen=True, slots=True)
class _Run:
    sandbox_id: str
    command: str
    env: dict[str, str]
    cwd: str
    user: str
    timeout_s: float | None


def _is_envd(path: str) -> bool:
    return path in ("/health", "/files") or path.startswith(("/process.", "/filesystem."))


def _user(request: _Request) -> str:
    """The envd user: Basic ``user:`` on RPCs (sent only when the caller names one), else E2B's ``user``."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("basic "):
        with contextlib.suppress(ValueError):
            return base64.b64decode(auth[6:]).decode().partition(":")[0] or DEFAULT_USER
    return DEFAULT_USER


def _home(user: str) -> str:
    return "/root" if user == "root" else f"/home/{user}"


def _resolve(path: str, user: str) -> str:
    """envd's reading of a path: relative ones (and ``~``) start at the user's home."""
    if path == "~" or path.startswith("~/"):
        path = _home(user) + path[1:]
    return posixpath.normpath(posixpath.join(_home(user), path))


def _file_error(exc: FileOperationError) -> _Reply:
    status = {errno.ENOENT: 404, errno.EISDIR: 400, errno.ENOSPC: 507, errno.EDQUOT: 507}.get(exc.errno or 0, 500)
    return _error(status, str(exc))


_FS_SCRIPT = r"""
import errno, grp, json, os, pwd, shutil, stat, sys
from datetime import datetime, timezone

def owner(lookup, key):
    try:
        return lookup(key)[0]
    except KeyError:
        return str(key)

def entry(path):
    st = os.lstat(path)
    info = {"name": os.path.basename(path) or "/", "path": path}
    if stat.S_ISLNK(st.st_mode):
        info.update(isSymlink=True, symlinkTarget=os.readlink(path))
        try:
            st = os.stat(path)
        except OSError:
            pass
    m = st.st_mode
    kinds = ((stat.S_ISDIR, "DIRECTORY"), (stat.S_ISREG, "FILE"), (stat.S_ISLNK, "SYMLINK"))
    kind = next((name for test, name in kinds if test(m)), "UNSPECIFIED")
    when = datetime.fromtimestamp(st.st_mtime, timezone.utc).isoformat().replace("+00:00", "Z")
    info.update(type="FILE_TYPE_" + kind, size=st.st_size, mode=m & 0o777, permissions=stat.filemode(m),
                owner=owner(pwd.getpwuid, st.st_uid), group=owner(grp.getgrgid, st.st_gid), modifiedTime=when)
    return info

def walk(path, depth):
    found = []
    for name in sorted(os.listdir(path)):
        child = os.path.join(path, name)
        found.append(entry(child))
        if depth > 1 and os.path.isdir(child) and not os.path.islink(child):
            found.extend(walk(child, depth - 1))
    return found

CODES = {errno.ENOENT: "not_found", errno.EEXIST: "already_exists", errno.ENOTDIR: "invalid_argument",
         errno.EISDIR: "invalid_argument", errno.EACCES: "permission_denied", errno.EPERM: "permission_denied"}
req = json.load(sys.stdin)
op, path = req["op"], req.get("path", "")
try:
    if op == "stat":
        out = {"entry": entry(path)}
    elif op == "list":
        if not os.path.isdir(path):
            os.stat(path)
            raise NotADirectoryError(errno.ENOTDIR, "path is not a directory", path)
        out = {"entries": walk(path, max(1, req.get("depth") or 1))}
    elif op == "mkdir":
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "directory already exists", path)
        os.makedirs(path)
        out = {"entry": entry(path)}
    elif op == "remove":
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
        out = {}
    else:
        src, dst = req["source"], req["destination"]
        os.lstat(src)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.rename(src, dst)
        out = {"entry": entry(dst)}
    print(json.dumps({"ok": out}))
except OSError as e:
    print(json.dumps({"code": CODES.get(e.errno, "internal"), "message": "%s: %s" % (e.strerror, e.filename)}))
"""
"""Filesystem RPCs, run by the sandbox's python3 on a JSON request on stdin; prints envd's answer."""


@pytest.fixture
def e2b_standin(backend: LocalBackend) -> Iterator[E2BStandin]:
    """A fresh stand-in (its own key, log and faults) over the session's local backend."""
    with E2BStandin(backend) as standin:
        yield standin
