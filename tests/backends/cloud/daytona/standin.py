"""A local stand-in for the Daytona service, spoken to by the real, unmodified ``daytona`` SDK (0.226).

One ``ThreadingHTTPServer`` on ``127.0.0.1`` serves both halves of Daytona: the control plane
(``/sandbox``, ``/snapshots``) and, under ``/toolbox/{sandboxId}``, each sandbox's daemon (the DTO's
``toolboxProxyUrl`` is this server's ``/toolbox``). Every call must carry
``Authorization: Bearer <api key>``, toolbox calls included; else 401. ``GET /socket.io/`` answers
404, so the SDK's event stream fails quietly and it polls ``GET /sandbox/{id}`` instead (every
1 s while it waits; ``use_deprecated_polling=True`` polls every 0.1 s, with a DeprecationWarning);
point it here with ``Daytona(standin.sdk_config())``.

Every Daytona sandbox is a snapgym local sandbox (``pool.LocalBackend``): commands and file calls
run inside it, never on the host. Snapshot :data:`DEFAULT_SNAPSHOT` (what a create without
``snapshot`` gets) is :data:`BASE_TEMPLATE`, the host userland under a writable layer with
``/home/daytona`` as home and working directory; ``sandbox.create_snapshot(name)`` keeps the files
as a local snapshot that later creates start from by name or id. Sandbox lifetimes follow
Daytona's rules (tests/backends/cloud/daytona/lifecycle.py) in minutes of :attr:`DaytonaStandin.minute_s`
seconds, enforced by a reaper thread.

What the API does and the stand-in copies (from Daytona's sources): a create answers state
``unknown`` and the SDK polls to ``started`` (``settle_polls`` GETs more report the transitional
state of any operation); an unknown snapshot is a 400, not a 404; ``create_snapshot`` answers
``snapshotting`` and a name already taken is dropped without an error (check with
``daytona.snapshot.get``); fork is refused (422) unless ``sandbox_class`` is ``linux-vm`` or
``windows``, and a sandbox with live forks cannot be deleted (400); stopping an ephemeral sandbox
destroys it; a destroyed sandbox is a 404. Known differences: commands run as root whatever
``os_user`` says; output comes when a command ends; snapshots, forks and stops keep files only,
never processes; of the network settings, ``networkBlockAll`` alone is enforced (false: the local
backend's open network through its egress proxy; true: none) and allow lists are only recorded;
resources are recorded and reported, not enforced; listings are ordered newest first (Daytona:
last activity first); image builds take a Dockerfile of one ``FROM`` line only (what
``CreateSandboxFromImageParams(image="ref")`` sends); no snapshot builds (``POST /snapshots``),
quotas, registries, volumes, PTY, git, LSP, code interpreter, preview links or websocket logs.

Creates from an image (``buildInfo``, tests/backends/cloud/daytona/builds.py) pull the ``FROM``
reference with the local backend (so the stand-in's backend needs the registry's settings, e.g.
``LocalBackend(registry=RegistrySettings(insecure_registries=[host]))``), once per Dockerfile as
Daytona builds once per Dockerfile hash; the sandbox is ``pending_build`` or ``building_snapshot``
until then and ``build_failed`` with the pull's error as ``errorReason`` if the image cannot be had.
A create from an image gets the body's ``cpu``, ``memory``, ``disk`` and ``gpu`` (Daytona's
defaults 1, 1, 3, 0 otherwise); a create from a snapshot gets the snapshot's, and
``create_snapshot`` keeps the sandbox's.

The parts, beside this file: wire.py (HTTP, error bodies, multipart), control.py (``/sandbox``),
lifecycle.py (states, lifetimes), snapshots.py (``/snapshots``), builds.py (image builds),
toolbox.py (``process/*``) and files.py (``files/*``).

Test modules load it with ``pytest_plugins = ["tests.backends.cloud.daytona.standin"]``, which gives them the
function-scoped ``daytona_standin`` fixture over the session's local backend. It has no asserts
of its own (PYTEST_DONT_REWRITE: test modules import it before pytest could rewrite it).
"""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pytest

from pool import LocalBackend, Snapshot, Template
from tests.backends.cloud.daytona.builds import BuildRecord
from tests.backends.cloud.daytona.control import DEFAULT_SNAPSHOT, HOME, ControlPlane
from tests.backends.cloud.daytona.lifecycle import SandboxRecord
from tests.backends.cloud.daytona.snapshots import SnapshotRecord
from tests.backends.cloud.daytona.toolbox import CommandRecord
from tests.backends.cloud.daytona.wire import api_error
from tests.backends.cloud.http_standin import Reply, Request, Server

if TYPE_CHECKING:
    from daytona import DaytonaConfig

__all__ = ["API_KEY_MARKER", "BASE_TEMPLATE", "DEFAULT_SNAPSHOT", "BuildRecord", "CommandRecord", "DaytonaStandin"]
__all__ += ["RequestRecord", "SandboxRecord", "SnapshotRecord", "daytona_standin"]

BASE_TEMPLATE = Template(
    name="daytona-standin-base", workdir=HOME, env={"HOME": HOME, "USER": "daytona", "LOGNAME": "daytona"}
)
"""What :data:`DEFAULT_SNAPSHOT` is: the daytona user's home over the host userland."""
API_KEY_MARKER = "<api-key>"
"""What the request and command logs show in place of the API key."""
_TOOLBOX = re.compile(r"/toolbox/([^/]+)(/.*)")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request the stand-in answered."""

    method: str
    path: str
    """As sent, without the query."""
    query: dict[str, str]
    """Repeated parameters joined with commas."""
    headers: dict[str, str]
    """Lower-case names; the API key, wherever it occurs, replaced by :data:`API_KEY_MARKER`."""
    status: int
    """The status answered (an injected fault's, if one matched)."""
    sandbox_id: str | None
    """The sandbox of a toolbox call, else None."""

    @property
    def is_toolbox(self) -> bool:
        return self.sandbox_id is not None


@dataclass(slots=True)
class _Fault:
    method: str
    path_prefix: str
    status: int
    remaining: int
    retry_after: int | None
    after: bool


def _setting(name: str, doc: str) -> Any:
    """A setting of the control plane, read and written through the stand-in."""
    return property(lambda self: getattr(self.control, name), lambda self, v: setattr(self.control, name, v), doc=doc)


class DaytonaStandin:
    """Daytona's API and sandbox daemons over local sandboxes; see the module docstring.

    Args:
        backend: the local backend whose sandboxes play Daytona's.
        api_key: the key every request must carry (default: a random one).
        minute_s: how many seconds a Daytona "minute" lasts (intervals and TTLs are in minutes).
        reap_interval_s: how often the reaper looks for sandboxes past their time.
        settle_polls: how many GETs after an operation still report its transitional state.
        sandbox_class: the class of new sandboxes; ``linux-vm`` or ``windows`` can fork.
        max_creates_per_s: answer 429 to creates and forks past this many in the last second.
        rate_limit_retry_after_s: the ``Retry-After`` of that 429 (None: no header).
        session_timeout_s: how long a session command may run (Daytona: no limit; None: the backend's).
    """

    minute_s = _setting("minute_s", "Seconds per Daytona minute.")
    settle_polls = _setting("settle_polls", "GETs that still report a transitional state.")
    sandbox_class = _setting("sandbox_class", "The class of new sandboxes.")
    max_creates_per_s = _setting("max_creates_per_s", "Creates and forks a second before 429.")
    rate_limit_retry_after_s = _setting("rate_limit_retry_after_s", "The 429's Retry-After.")

    def __init__(
        self,
        backend: LocalBackend,
        *,
        api_key: str | None = None,
        minute_s: float = 60.0,
        reap_interval_s: float = 0.05,
        settle_polls: int = 0,
        sandbox_class: str = "container",
        max_creates_per_s: float | None = None,
        rate_limit_retry_after_s: int | None = 1,
        session_timeout_s: float | None = None,
    ) -> None:
        self.backend = backend
        self.api_key = api_key or f"dtn_{secrets.token_hex(32)}"
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._requests: list[RequestRecord] = []
        self._commands: list[CommandRecord] = []
        self._closed = False
        self._server = Server(self.handle)
        self.url = self._server.url
        """The API URL (``DaytonaConfig.api_url``)."""
        self.control = ControlPlane(
            backend,
            toolbox_url=f"{self.url}/toolbox",
            record_command=self._record_command,
            minute_s=minute_s,
            settle_polls=settle_polls,
            sandbox_class=sandbox_class,
            max_creates_per_s=max_creates_per_s,
            rate_limit_retry_after_s=rate_limit_retry_after_s,
            session_timeout_s=session_timeout_s,
        )
        self.base_snapshot = self.add_snapshot(DEFAULT_SNAPSHOT, BASE_TEMPLATE, general=True)
        self._closing = threading.Event()
        self._threads = [
            threading.Thread(target=self._server.serve_forever, args=(0.05,), name="daytona-standin", daemon=True),
            threading.Thread(target=self._reap_loop, args=(reap_interval_s,), name="daytona-reaper", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    # -- for tests ---------------------------------------------------------------------------

    def sdk_config(self, **overrides: Any) -> DaytonaConfig:
        """``Daytona(standin.sdk_config())``: the key, the URL, target ``us``, state by polling
        (``use_deprecated_polling=False``: the SDK falls back to polling on the socket.io 404)."""
        from daytona import DaytonaConfig

        options = {"api_key": self.api_key, "api_url": self.url, "target": "us", "use_deprecated_polling": False}
        return DaytonaConfig(**{**options, **overrides})

    @property
    def sdk_env(self) -> dict[str, str]:
        """The same as environment variables, for an SDK client in another process."""
        return {"DAYTONA_API_KEY": self.api_key, "DAYTONA_API_URL": self.url, "DAYTONA_TARGET": "us"}

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request answered so far, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def commands(self) -> list[CommandRecord]:
        """Every command a toolbox ran so far, oldest first (not the file helpers)."""
        with self._lock:
            return list(self._commands)

    @property
    def created_count(self) -> int:
        """Sandboxes started by create and fork."""
        return self.control.created_count

    def sandboxes(self) -> dict[str, SandboxRecord]:
        """Every sandbox ever created, by id, destroyed ones included."""
        return self.control.sandboxes()

    def builds(self) -> dict[str, BuildRecord]:
        """Every image build made so far, by its ref (``daytona-<sha256>:daytona``)."""
        return self.control.builds.records()

    def snapshots(self) -> dict[str, SnapshotRecord]:
        """Every snapshot not deleted, by name, :data:`DEFAULT_SNAPSHOT` included."""
        return self.control.snapshots.records()

    def add_snapshot(self, name: str, template: Template | Snapshot, *, general: bool = False) -> Snapshot:
        """Make ``name`` a snapshot creates can start from (``general``: the stand-in's own, undeletable)."""
        local = self.backend.build(template) if isinstance(template, Template) else template
        self.control.snapshots.add(name, local, general=general, sandbox_class=self.sandbox_class)
        return local

    def fail_next(
        self,
        method: str,
        path_prefix: str,
        status: int,
        count: int = 1,
        retry_after: int | None = None,
        *,
        after: bool = False,
    ) -> None:
        """Answer the next ``count`` requests matching ``method`` (``"*"``: any) and ``path_prefix``
        with ``status`` and an API error body.

        Args:
            retry_after: send ``Retry-After`` with this many seconds (the SDK retries nothing anyway).
            after: carry the request out first and lose its answer (a create that happened, whose
                200 never arrived).
        """
        with self._lock:
            self._faults.append(_Fault(method.upper(), path_prefix, status, count, retry_after, after))

    def clear_faults(self) -> None:
        """Forget the faults :meth:`fail_next` queued that have not struck yet."""
        with self._lock:
            self._faults.clear()

    def close(self) -> None:
        """Stop serving and destroy every sandbox. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        self._server.stop()
        self.control.destroy_all("close")
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> DaytonaStandin:
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
                reply = api_error(request, 400, f"bad request: {exc!r}")
            except Exception as exc:  # a stand-in or backend failure: say so rather than drop the connection
                reply = api_error(request, 500, f"the stand-in failed: {exc!r}")
            reply = self._take_fault(request, after=True) or reply
        headers = {k: v.replace(self.api_key, API_KEY_MARKER) for k, v in request.headers.items()}
        query = {k: ",".join(v) for k, v in request.query.items()}
        toolbox = _TOOLBOX.fullmatch(request.path)
        sandbox_id = unquote(toolbox[1]) if toolbox else None
        with self._lock:
            self._requests.append(RequestRecord(request.method, request.path, query, headers, reply.status, sandbox_id))
        return reply

    def _route(self, request: Request) -> Reply:
        if request.path.startswith("/socket.io"):  # no event stream: the SDK falls back to polling
            return api_error(request, 404, f"Cannot {request.method} {request.path}")
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return api_error(request, 401, "Unauthorized")
        if toolbox := _TOOLBOX.fullmatch(request.path):
            return self.control.toolbox_call(request, unquote(toolbox[1]), toolbox[2])
        for method, pattern, handler in self.control.routes:
            match = pattern.fullmatch(request.path)
            if match and method == request.method:
                return handler(request, *(unquote(group) for group in match.groups()))
        return api_error(request, 404, f"Cannot {request.method} {request.path}")

    def _take_fault(self, request: Request, *, after: bool) -> Reply | None:
        with self._lock:
            for fault in self._faults:
                matches = fault.method in ("*", request.method) and request.path.startswith(fault.path_prefix)
                if fault.after == after and matches:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                    headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                    return api_error(request, fault.status, "injected fault", headers)
        return None

    def _record_command(self, record: CommandRecord) -> None:
        env = {k: v.replace(self.api_key, API_KEY_MARKER) for k, v in record.env.items()}
        with self._lock:
            self._commands.append(replace(record, env=env))

    def _reap_loop(self, interval_s: float) -> None:
        while not self._closing.wait(interval_s):
            self.control.reap()


@pytest.fixture
def daytona_standin(backend: LocalBackend) -> Iterator[DaytonaStandin]:
    """A fresh stand-in (its own key, log and faults) over the session's local backend."""
    with DaytonaStandin(backend) as standin:
        yield standin
