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

The parts: tests/backends/cloud/e2b/wire.py (HTTP, Connect framing, error bodies, multipart),
tests/backends/cloud/e2b/control.py (sandboxes, snapshots and templates), tests/backends/cloud/e2b/lifecycle.py (states,
lifetimes, pause) and tests/backends/cloud/e2b/envd.py (process and filesystem RPCs, ``/files``).

Test modules load it with ``pytest_plugins = ["tests.backends.cloud.e2b.standin"]``, which gives them the
function-scoped ``e2b_standin`` fixture over the session's local backend, and import its names.
It has no asserts of its own (PYTEST_DONT_REWRITE: test modules import it before pytest could
rewrite it).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote

import pytest
from e2b import ApiParams

from pool import LocalBackend, Snapshot, Template
from tests.backends.cloud.e2b.control import MAX_FORKS, ControlPlane, SnapshotRecord
from tests.backends.cloud.e2b.envd import DEFAULT_USER, CommandRecord, Envd, is_envd
from tests.backends.cloud.e2b.lifecycle import CLIENT_ID, ENVD_VERSION, SandboxRecord
from tests.backends.cloud.e2b.wire import api_error
from tests.backends.cloud.http_standin import Reply, Request, Server, json_reply

__all__ = ["API_KEY_MARKER", "BASE_TEMPLATE", "CLIENT_ID", "DEFAULT_USER", "ENVD_VERSION", "MAX_FORKS"]
__all__ += ["CommandRecord", "E2BStandin", "RequestRecord", "SandboxRecord", "SnapshotRecord", "e2b_standin"]

BASE_TEMPLATE = Template(name="e2b-standin-base", workdir="/home/user")
"""What template ``"base"`` is: E2B's default user's home over the host userland."""
API_KEY_MARKER = "<api-key>"
"""What the request and command logs show in place of the API key."""


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


@dataclass(slots=True)
class _Fault:
    method: str
    path_prefix: str
    status: int
    remaining: int
    retry_after: int | None
    should_retry: bool | None
    after: bool


def _setting(name: str, doc: str) -> Any:
    """A setting of the control plane, read and written through the stand-in."""
    return property(lambda self: getattr(self.control, name), lambda self, v: setattr(self.control, name, v), doc=doc)


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

    default_timeout_s = _setting("default_timeout_s", "A sandbox's lifetime when create does not say.")
    max_creates_per_s = _setting("max_creates_per_s", "Creates and forks a second before 429.")
    rate_limit_retry_after_s = _setting("rate_limit_retry_after_s", "The 429's Retry-After.")

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
        self.control = ControlPlane(
            backend,
            default_timeout_s=default_timeout_s,
            max_creates_per_s=max_creates_per_s,
            rate_limit_retry_after_s=rate_limit_retry_after_s,
        )
        self.envd = Envd(self.control.sandboxes.live, self._record_command)
        self.base_snapshot = self.add_template("base", BASE_TEMPLATE)
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._requests: list[RequestRecord] = []
        self._commands: list[CommandRecord] = []
        self._closed = False
        self._server = Server(self.handle)
        self.url = self._server.url
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
        return self.control.sandboxes.created_count

    def sandboxes(self) -> dict[str, SandboxRecord]:
        """Every sandbox ever created, by id, killed ones included."""
        return self.control.sandboxes.records()

    def snapshots(self) -> dict[str, SnapshotRecord]:
        """Every snapshot not deleted, by id."""
        return self.control.snapshots()

    def add_template(self, name: str, template: Template | Snapshot) -> Snapshot:
        """Make ``name`` a template ``Sandbox.create(template=name)`` can start from."""
        snapshot = self.backend.build(template) if isinstance(template, Template) else template
        self.control.add_template(name, snapshot)
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
        self._server.stop()
        self.control.sandboxes.end_all("close")
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> E2BStandin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- dispatch ----------------------------------------------------------------------------

    def handle(self, request: Request) -> Reply:
        """Answer one request (called by the HTTP handler's threads)."""
        reply = self._take_fault(request, after=False)
        if reply is None:
            try:
                reply = self._route(request)
            except (ValueError, KeyError, TypeError) as exc:  # a body that is not what the route expects
                reply = api_error(400, f"bad request: {exc!r}")
            except Exception as exc:  # a stand-in or backend failure: say so rather than drop the connection
                reply = api_error(500, f"the stand-in failed: {exc!r}")
            if (lost := self._take_fault(request, after=True)) is not None:
                for _ in reply.stream or ():
                    pass
                reply = lost
        self._log(request, reply.status)
        return reply

    def _route(self, request: Request) -> Reply:
        if is_envd(request.path):
            return self.envd.handle(request)
        if request.headers.get("x-api-key") != self.api_key:
            return api_error(401, "Invalid API key, it must start with 'e2b_' and be valid")
        for method, pattern, handler in self.control.routes:
            match = pattern.fullmatch(request.path)
            if match and method == request.method:
                return handler(request, *(unquote(group) for group in match.groups()))
        return api_error(404, f"no route {request.method} {request.path}")

    def _take_fault(self, request: Request, *, after: bool) -> Reply | None:
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
                    return json_reply(fault.status, {"code": fault.status, "message": "injected fault"}, headers)
        return None

    def _log(self, request: Request, status: int) -> None:
        headers = {name: self._redact(value) for name, value in request.headers.items()}
        sandbox_id = request.headers.get("e2b-sandbox-id", "") if is_envd(request.path) else None
        query = {name: values[-1] for name, values in request.query.items()}
        record = RequestRecord(request.method, request.path, query, headers, status, sandbox_id)
        with self._lock:
            self._requests.append(record)

    def _redact(self, value: str) -> str:
        return value.replace(self.api_key, API_KEY_MARKER)

    def _record_command(self, record: CommandRecord) -> None:
        env = {k: self._redact(v) for k, v in record.env.items()}
        with self._lock:
            self._commands.append(replace(record, env=env))

    def _reap_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.control.sandboxes.reap()


@pytest.fixture
def e2b_standin(backend: LocalBackend) -> Iterator[E2BStandin]:
    """A fresh stand-in (its own key, log and faults) over the session's local backend."""
    with E2BStandin(backend) as standin:
        yield standin
