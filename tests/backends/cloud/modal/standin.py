"""A local stand-in for Modal, spoken to by the real, unmodified ``modal`` SDK (1.6.4).

Two grpclib servers on ``127.0.0.1`` run on their own asyncio loop in a background thread: the
API server (:mod:`modal_control`, a ``ModalClientBase``: auth, apps, images, secrets, V1 and V2
sandbox lifecycle, tags, listing) and the task command router (:mod:`modal_router`, a
``TaskCommandRouterBase``: exec with stdin/stdout/stderr/wait/poll, the filesystem API's fs-tools
ops, filesystem snapshots). The API server hands out the router's ``http://`` URL, which the SDK
accepts because the API server's host is ``127.0.0.1`` (``Client._is_localhost``).

Point the SDK at it without touching ``os.environ`` with :meth:`ModalStandin.client` (the SDK's
own ``Client(server_url, CLIENT_TYPE_CLIENT, (token_id, token_secret))``, opened; the public
``Client.from_credentials`` reads the URL from ``MODAL_SERVER_URL``), then pass ``client=`` to
``App.lookup``, ``Sandbox.create``/``from_id``/``list`` and ``Image.from_id``. Another process
gets :attr:`ModalStandin.sdk_env`. Every call checks the token id and secret (else
UNAUTHENTICATED: ``AuthError``).

Every Modal sandbox is a snapgym local sandbox (``pool.LocalBackend``): commands and file calls
run inside it, never on the host. :attr:`ModalStandin.base_image_id` is :data:`BASE_TEMPLATE` (the
host userland under a writable layer, workdir ``/root``); ``snapshot_filesystem`` makes a local
snapshot with an image id of its own, which ``Image.from_id`` and ``Sandbox.create(image=...)``
start from. Sandboxes past their ``timeout`` are terminated by a reaper thread.

Images: ``Image.from_id`` of the base or a snapshot, and ``Image.from_registry`` of an image the
local backend can pull (:mod:`.images`: one build per definition, a failed pull is a failed
build). A sandbox created with the network (no ``block_network``, no allowlist) reaches it through
the local backend's egress proxy (its commands get ``HTTP_PROXY``); other network settings are
recorded, not enforced. Known differences from Modal: no other image builds (``image=None``,
``debian_slim``, ``pip_install`` fail UNIMPLEMENTED on ``ImageGetOrCreate``); output is sent when a
command ends, as the raw bytes the command wrote (the SDK decodes them, strictly in text mode);
GPUs, CPU, memory, regions and volumes are recorded, not provided; commands run as root; no PTY,
tunnels, sandbox entrypoint stdio, memory snapshots or ``filesystem.watch``. Tests inject faults with
:meth:`ModalStandin.fail_next` and read :attr:`ModalStandin.requests`, :attr:`ModalStandin.commands`
and :meth:`ModalStandin.sandboxes`.

Test modules load it with ``pytest_plugins = ["tests.backends.cloud.modal.standin"]`` (the function-scoped
``modal_standin`` fixture over the session's local backend). PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import modal
import pytest
from grpclib import Status
from grpclib.server import Server
from modal._utils.grpc_utils import custom_detail_codec
from modal_proto import api_pb2

from pool import LocalBackend, Snapshot, Template
from pool.backends.local import LocalSandbox
from tests.backends.cloud.modal.control import ControlPlane
from tests.backends.cloud.modal.images import BuildRecord, ImageBuilds
from tests.backends.cloud.modal.router import Router
from tests.backends.cloud.modal.wire import (
    JWT_MARKER,
    TOKEN_SECRET_MARKER,
    CommandRecord,
    ImageRecord,
    Ledger,
    RequestRecord,
    SandboxRecord,
    make_jwt,
    new_id,
    not_found,
)

__all__ = [
    "BASE_TEMPLATE",
    "BuildRecord",
    "JWT_MARKER",
    "TOKEN_SECRET_MARKER",
    "CommandRecord",
    "ImageRecord",
    "ModalStandin",
    "RequestRecord",
    "SandboxRecord",
]

BASE_TEMPLATE = Template(name="modal-standin-base", workdir="/root")
"""What :attr:`ModalStandin.base_image_id` is: the host userland, root's home as workdir."""


@dataclass(slots=True)
class Box:
    """A sandbox's mutable state, guarded by the stand-in's lock."""

    record: SandboxRecord
    local: LocalSandbox | None
    python3: bool = True
    """Whether the sandbox has a ``python3`` (the router's relay is a bash script where it has not)."""


class ModalStandin:
    """Modal's API server and task command router over local sandboxes; see the module docstring.

    Args:
        backend: the local backend whose sandboxes play Modal's.
        token_id: the token id every call must carry (default: a random ``ak-`` one).
        token_secret: its secret (default: a random ``as-`` one).
        reap_interval_s: how often the reaper looks for sandboxes past their lifetime.
        max_creates_per_s: answer RESOURCE_EXHAUSTED to creates past this many in the last second.
        rate_limit_retry_after_s: attach Modal's ``RPCRetryPolicy`` with this delay to that answer,
            which makes the SDK sleep and retry instead of raising ``ResourceExhaustedError``.
    """

    def __init__(
        self,
        backend: LocalBackend,
        *,
        token_id: str | None = None,
        token_secret: str | None = None,
        reap_interval_s: float = 0.1,
        max_creates_per_s: float | None = None,
        rate_limit_retry_after_s: float | None = None,
    ) -> None:
        self.backend = backend
        self.token_id = token_id or new_id("ak")
        self.token_secret = token_secret or new_id("as")
        self.max_creates_per_s = max_creates_per_s
        self.rate_limit_retry_after_s = rate_limit_retry_after_s
        self.ledger = Ledger(self.token_secret)
        self.lock = threading.RLock()
        self._boxes: dict[str, Box] = {}
        self._images: dict[str, ImageRecord] = {}
        self._apps: dict[str, str] = {}
        self._secrets: dict[str, dict[str, str]] = {}
        self._jwts: dict[str, str] = {}
        """Router JWT -> the task id it is for."""
        self._create_times: list[float] = []
        self._created = 0
        self._clients: list[modal.Client] = []
        self._closed = False
        self.builds = ImageBuilds(self)
        """The image builder (``Image.from_registry``); :meth:`ImageBuilds.records` lists its builds."""
        self.base_snapshot = backend.build(BASE_TEMPLATE)
        self.base_image_id = self.add_image(self.base_snapshot, "base").image_id
        self.loop = asyncio.new_event_loop()
        self._threads = [threading.Thread(target=self.loop.run_forever, name="modal-standin", daemon=True)]
        self._threads[0].start()
        self._servers: list[Server] = []
        ports = asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(timeout=30)
        self.url = f"http://127.0.0.1:{ports[0]}"
        """The API server, ``MODAL_SERVER_URL``."""
        self.router_url = f"http://127.0.0.1:{ports[1]}"
        """The task command router every sandbox's access points at."""
        self._stop = threading.Event()
        reaper = threading.Thread(target=self._reap_loop, args=(reap_interval_s,), name="modal-reaper", daemon=True)
        self._threads.append(reaper)
        reaper.start()

    # -- for tests ---------------------------------------------------------------------------

    def client(self, *, token_secret: str | None = None) -> modal.Client:
        """An opened ``modal.Client`` for this stand-in (closed with it); ``token_secret`` overrides the secret."""
        credentials = (self.token_id, token_secret if token_secret is not None else self.token_secret)
        client = modal.Client(self.url, api_pb2.CLIENT_TYPE_CLIENT, credentials)
        client.__enter__()  # type: ignore[no-untyped-call]  # opens the channel; the first RPC checks the credentials
        with self.lock:
            self._clients.append(client)
        return client

    @property
    def sdk_env(self) -> dict[str, str]:
        """The same as environment variables, for an SDK in another process (``Client.from_env``)."""
        return {"MODAL_SERVER_URL": self.url, "MODAL_TOKEN_ID": self.token_id, "MODAL_TOKEN_SECRET": self.token_secret}

    @property
    def requests(self) -> list[RequestRecord]:
        """Every RPC answered so far by either server, oldest first."""
        with self.ledger.lock:
            return list(self.ledger.requests)

    @property
    def commands(self) -> list[CommandRecord]:
        """Every command the router ran to its end, oldest first."""
        with self.ledger.lock:
            return list(self.ledger.commands)

    @property
    def created_count(self) -> int:
        """Sandboxes started by SandboxCreateV2 and SandboxCreate."""
        with self.lock:
            return self._created

    def sandboxes(self) -> dict[str, SandboxRecord]:
        """Every sandbox ever created, by id, finished ones included."""
        with self.lock:
            return {sid: box.record for sid, box in self._boxes.items()}

    def images(self) -> dict[str, ImageRecord]:
        """Every image id the stand-in serves: the base, each registry image built, each filesystem snapshot."""
        with self.lock:
            return dict(self._images)

    def fail_next(
        self,
        rpc: str,
        grpc_status: Status | str,
        count: int = 1,
        *,
        message: str = "injected fault",
        retry_after_s: float | None = None,
    ) -> None:
        """Answer the next ``count`` calls of ``rpc`` (e.g. ``"SandboxCreateV2"``, ``"TaskExecStart"``)
        with ``grpc_status`` (a ``grpclib.Status`` or its name) instead of carrying them out.

        Args:
            retry_after_s: attach Modal's ``RPCRetryPolicy`` (server-side throttling), which the SDK
                obeys by sleeping that long and retrying, whatever the status.
        """
        status = grpc_status if isinstance(grpc_status, Status) else Status[grpc_status]
        self.ledger.add_fault(rpc, status, count, message, retry_after_s)

    def clear_faults(self) -> None:
        """Forget the faults :meth:`fail_next` queued that have not struck yet."""
        self.ledger.clear_faults()

    def close(self) -> None:
        """Close the clients it made, end every sandbox, stop serving. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        with self.lock:
            boxes = list(self._boxes.values())
        for box in boxes:
            self.end_box(box, "close")
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._unserve(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        for thread in self._threads:
            thread.join(timeout=5)
        self.loop.close()

    def __enter__(self) -> ModalStandin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state the servicers share -------------------------------------------------------------

    def add_image(
        self, snapshot: Snapshot, kind: str, sandbox_id: str | None = None, *, image_id: str | None = None
    ) -> ImageRecord:
        record = ImageRecord(image_id or new_id("im"), kind, snapshot, sandbox_id, time.time())
        with self.lock:
            self._images[record.image_id] = record
        return record

    def expire_image(self, image_id: str) -> None:
        """Forget an image, as Modal does when a filesystem snapshot's image expires (30 days by default):
        ``ImageFromId`` answers NOT_FOUND from then on."""
        with self.lock:
            self._images.pop(image_id, None)

    def image(self, image_id: str) -> ImageRecord | None:
        with self.lock:
            return self._images.get(image_id)

    def app_id(self, name: str, *, create: bool) -> str | None:
        """The id of app ``name`` (or of the app whose id ``name`` is), made if ``create``."""
        with self.lock:
            if name in self._apps.values():
                return name
            if name not in self._apps and create:
                self._apps[name] = new_id("ap")
            return self._apps.get(name)

    def app_name(self, app_id: str) -> str | None:
        with self.lock:
            return next((name for name, known in self._apps.items() if known == app_id), None)

    def add_secret(self, env: dict[str, str]) -> str:
        secret_id = new_id("st")
        with self.lock:
            self._secrets[secret_id] = dict(env)
        return secret_id

    def secret(self, secret_id: str) -> dict[str, str] | None:
        with self.lock:
            found = self._secrets.get(secret_id)
            return dict(found) if found is not None else None

    def env_of(self, secret_ids: list[str], sources: list[api_pb2.SecretSource]) -> dict[str, str]:
        """The variables of secrets by id, then of inline ``secret_sources`` (how ``env=`` travels)."""
        env: dict[str, str] = {}
        for secret_id in [*secret_ids, *(src.secret_id for src in sources if src.secret_id)]:
            found = self.secret(secret_id)
            if found is None:
                raise not_found(f"Secret {secret_id}")
            env.update(found)
        for src in sources:
            env.update(src.env.contents)
        return env

    def router_jwt(self, task_id: str) -> str:
        token = make_jwt({"task_id": task_id})
        with self.lock:
            self._jwts[token] = task_id
        return token

    def jwt_task(self, token: str) -> str | None:
        with self.lock:
            return self._jwts.get(token)

    def take_create_slot(self) -> bool:
        """Count a create against ``max_creates_per_s``; False when it is over the limit."""
        now = time.monotonic()
        with self.lock:
            self._create_times = [t for t in self._create_times if now - t < 1.0]
            if self.max_creates_per_s is not None and len(self._create_times) >= self.max_creates_per_s:
                return False
            self._create_times.append(now)
            return True

    def add_box(self, record: SandboxRecord, local: LocalSandbox, *, python3: bool = True) -> Box:
        box = Box(record, local, python3)
        with self.lock:
            self._boxes[record.sandbox_id] = box
            self._created += 1
        return box

    def box(self, sandbox_id: str) -> Box | None:
        with self.lock:
            return self._boxes.get(sandbox_id)

    def box_for_task(self, task_id: str) -> Box | None:
        with self.lock:
            return next((b for b in self._boxes.values() if b.record.task_id == task_id), None)

    def all_boxes(self) -> list[Box]:
        with self.lock:
            return list(self._boxes.values())

    def set_tags(self, box: Box, tags: dict[str, str]) -> None:
        with self.lock:
            box.record = replace(box.record, tags=dict(tags))

    def end_box(self, box: Box, ended_by: str, exit_code: int | None = None) -> bool:
        """Finish a running sandbox and close its local one (False: it had finished already)."""
        with self.lock:
            if box.record.state != "running":
                return False
            local, box.local = box.local, None
            box.record = replace(box.record, state="finished", ended_by=ended_by, exit_code=exit_code)
        if local is not None:
            with contextlib.suppress(Exception):  # a sandbox that fails to close is gone for the SDK anyway
                local.close()
        return True

    # -- serving -----------------------------------------------------------------------------

    async def _serve(self) -> list[int]:
        ports = []
        # serve_the_rest filled in every abstract RPC, which mypy cannot see
        for servicer in (ControlPlane(self), Router(self)):  # type: ignore[abstract]
            # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on such sockets (else ~40 ms per RPC)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sock.bind(("127.0.0.1", 0))
            server = Server([servicer], status_details_codec=custom_detail_codec)
            await server.start(sock=sock)
            self._servers.append(server)
            ports.append(sock.getsockname()[1])
        return ports

    async def _unserve(self) -> None:
        for server in self._servers:
            server.close()
        await asyncio.wait_for(asyncio.gather(*(s.wait_closed() for s in self._servers)), timeout=5)

    def _reap_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            now = time.time()
            for box in self.all_boxes():
                if box.record.state == "running" and box.record.end_at <= now:
                    self.end_box(box, "timeout")


@pytest.fixture
def modal_standin(backend: LocalBackend) -> Iterator[ModalStandin]:
    """A fresh stand-in (its own token, log and faults) over the session's local backend."""
    with ModalStandin(backend) as standin:
        yield standin
