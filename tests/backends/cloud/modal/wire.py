"""What the Modal stand-in's two gRPC servers share: the records tests read, the ledger of calls and
queued faults, the decorators that turn a servicer method into a grpclib handler, ids and JWTs.

A servicer method is written as ``async def Name(self, request, metadata) -> reply`` (:func:`unary`),
as an async generator of replies (:func:`replies`), or over the raw stream (:func:`raw`). Each
decorated call goes through :meth:`Ledger.call`: the servicer's ``authorize`` check, then a fault
queued by ``fail_next``, then the method; whatever it answers is logged. :func:`serve_the_rest`
answers every RPC a servicer leaves out with UNIMPLEMENTED, logged too, so a backend author sees
which call the stand-in lacks. PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import contextlib
import functools
import json
import re
import secrets
import string
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from grpclib import GRPCError, Status
from grpclib.server import Stream
from modal_proto import api_pb2

from pool import Snapshot

TOKEN_SECRET_MARKER = "<token-secret>"
JWT_MARKER = "<jwt>"
_ALNUM = string.ascii_letters + string.digits
_JWT = re.compile(r"[\w-]{8,}\.[\w-]{8,}\.[\w-]{8,}")
Authorize = Callable[[str, Mapping[str, str], Message | None], None]
"""A servicer's check of one call: raise GRPCError(UNAUTHENTICATED) to refuse it."""
S = TypeVar("S")
Handler = Callable[[Any, "Stream[Any, Any]"], Coroutine[Any, Any, None]]
"""What grpclib calls for an RPC: ``await servicer.Name(stream)``."""


# -- what tests see ---------------------------------------------------------------------------


NETWORK = {
    api_pb2.NetworkAccess.OPEN: "open",
    api_pb2.NetworkAccess.BLOCKED: "blocked",
    api_pb2.NetworkAccess.ALLOWLIST: "allowlist",
}
"""A ``NetworkAccess`` type as the records name it."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One RPC either server answered."""

    server: str
    """``control`` (the API server) or ``router`` (the task command router)."""
    rpc: str
    fields: dict[str, Any]
    """The request as JSON (proto field names); bytes fields as ``"<N bytes>"``."""
    metadata: dict[str, str]
    """Request headers; the token secret and every JWT masked (:data:`TOKEN_SECRET_MARKER`, :data:`JWT_MARKER`)."""
    status: str
    """``OK`` or the gRPC status answered (an injected fault's, if one struck)."""


@dataclass(frozen=True, slots=True)
class CommandRecord:
    """One ``sb.exec`` the router ran (filesystem calls included, by their fs-tools argv)."""

    sandbox_id: str
    exec_id: str
    argv: tuple[str, ...]
    env: dict[str, str]
    """The variables added for it: the sandbox's and the exec's."""
    workdir: str
    timeout_s: int | None
    exit_code: int
    timed_out: bool
    stdin_bytes: int


@dataclass(frozen=True, slots=True)
class SandboxRecord:
    """A Modal sandbox as the stand-in knows it, running or not."""

    sandbox_id: str
    task_id: str
    app_id: str
    api: str
    """``v2`` (SandboxCreateV2) or ``v1`` (SandboxCreate: GPU, PTY or NFS sandboxes)."""
    image_id: str
    name: str | None
    tags: dict[str, str]
    env: dict[str, str]
    workdir: str
    entrypoint: tuple[str, ...]
    timeout_s: int
    gpu: str | None
    """``TYPE`` or ``TYPE:COUNT`` as requested (recorded only: local sandboxes have no GPU)."""
    cpu: float | None
    memory_mb: int | None
    network: str
    """``open``, ``blocked`` or ``allowlist`` (recorded only)."""
    outbound_cidrs: tuple[str, ...]
    outbound_domains: tuple[str, ...]
    network_changes: tuple[dict[str, Any], ...]
    """Each ``TaskSetNetworkAccess`` (``_experimental_set_outbound_network_policy``) as JSON, oldest first;
    the three fields above follow the last one."""
    definition: dict[str, Any]
    """The whole ``api_pb2.Sandbox`` definition as JSON, for anything not broken out above."""
    created_at: float
    end_at: float
    """Unix time the lifetime (``timeout``) ends; the reaper terminates it then."""
    state: str = "running"
    """``running`` or ``finished``."""
    ended_by: str | None = None
    """``terminate`` (the API), ``timeout`` (the reaper), ``exit`` (its entrypoint ended) or ``close``."""
    exit_code: int | None = None


@dataclass(frozen=True, slots=True)
class ImageRecord:
    """An image id the stand-in knows and the local snapshot it stands for."""

    image_id: str
    kind: str
    """``base``, ``registry`` (an ``Image.from_registry`` build) or ``filesystem-snapshot``."""
    snapshot: Snapshot
    sandbox_id: str | None
    """The sandbox a filesystem snapshot was taken of."""
    created_at: float


# -- the ledger -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Fault:
    rpc: str
    status: Status
    remaining: int
    message: str
    retry_after_s: float | None


@dataclass(slots=True)
class Ledger:
    """The calls both servers answered and the faults queued for them; thread-safe."""

    token_secret: str
    requests: list[RequestRecord] = field(default_factory=list)
    commands: list[CommandRecord] = field(default_factory=list)
    faults: list[_Fault] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_fault(self, rpc: str, status: Status, count: int, message: str, retry_after_s: float | None) -> None:
        with self.lock:
            self.faults.append(_Fault(rpc, status, count, message, retry_after_s))

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()

    def take_fault(self, rpc: str) -> GRPCError | None:
        with self.lock:
            for fault in self.faults:
                if fault.rpc == rpc:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self.faults.remove(fault)
                    details = None
                    if fault.retry_after_s is not None:
                        details = [api_pb2.RPCRetryPolicy(retry_after_secs=fault.retry_after_s)]
                    return GRPCError(fault.status, fault.message, details)
        return None

    def add_command(self, record: CommandRecord) -> None:
        with self.lock:
            self.commands.append(record)

    def mask(self, value: str) -> str:
        return _JWT.sub(JWT_MARKER, value.replace(self.token_secret, TOKEN_SECRET_MARKER))

    @contextlib.asynccontextmanager
    async def call(
        self, server: str, rpc: str, metadata: Mapping[str, str], request: Message | None, authorize: Authorize
    ) -> AsyncIterator[None]:
        """Authorize, strike a queued fault or let the body answer; log the outcome either way."""
        status = "OK"
        try:
            authorize(rpc, metadata, request)
            if (fault := self.take_fault(rpc)) is not None:
                raise fault
            yield
        except GRPCError as exc:
            status = exc.status.name
            raise
        except asyncio.CancelledError:  # the client gave up (its deadline) or the server is closing
            status = Status.CANCELLED.name
            raise
        except Exception as exc:  # a stand-in or backend failure: say so rather than drop the call
            status = Status.INTERNAL.name
            raise GRPCError(Status.INTERNAL, f"the Modal stand-in failed: {exc!r}") from exc
        finally:
            record = RequestRecord(
                server,
                rpc,
                _fields(request),
                {k: self.mask(str(v)) for k, v in metadata.items()},
                status,
            )
            with self.lock:
                self.requests.append(record)


def _fields(request: Message | None) -> dict[str, Any]:
    if request is None:
        return {}
    fields: dict[str, Any] = MessageToDict(request, preserving_proto_field_name=True)
    for descriptor, value in request.ListFields():
        if descriptor.type == descriptor.TYPE_BYTES:
            fields[descriptor.name] = f"<{len(value)} bytes>"
    return fields


# -- servicer plumbing ---------------------------------------------------------------------------


def unary(method: Callable[[Any, Any, dict[str, str]], Awaitable[Message]]) -> Handler:
    """``async def Name(self, request, metadata) -> reply`` as a unary grpclib handler."""

    @functools.wraps(method)
    async def handler(self: Any, stream: Stream[Any, Any]) -> None:
        request = await stream.recv_message()
        metadata = {k: str(v) for k, v in (stream.metadata or {}).items()}
        async with self.ledger.call(self.server, method.__name__, metadata, request, self.authorize):
            reply = await method(self, request, metadata)
        await stream.send_message(reply)

    return handler


def replies(
    method: Callable[[Any, Any, dict[str, str]], AsyncIterator[Message]],
) -> Handler:
    """``async def Name(self, request, metadata)`` yielding replies, as a server-streaming handler."""

    @functools.wraps(method)
    async def handler(self: Any, stream: Stream[Any, Any]) -> None:
        request = await stream.recv_message()
        metadata = {k: str(v) for k, v in (stream.metadata or {}).items()}
        async with self.ledger.call(self.server, method.__name__, metadata, request, self.authorize):
            async for reply in method(self, request, metadata):
                await stream.send_message(reply)

    return handler


def raw(method: Callable[[Any, Stream[Any, Any], dict[str, str]], Awaitable[None]]) -> Handler:
    """``async def Name(self, stream, metadata)`` reading the stream itself (client streaming)."""

    @functools.wraps(method)
    async def handler(self: Any, stream: Stream[Any, Any]) -> None:
        metadata = {k: str(v) for k, v in (stream.metadata or {}).items()}
        async with self.ledger.call(self.server, method.__name__, metadata, None, self.authorize):
            await method(self, stream, metadata)

    return handler


def serve_the_rest(cls: type[S]) -> type[S]:
    """Answer every abstract RPC ``cls`` does not define with UNIMPLEMENTED (logged)."""

    def unimplemented(rpc: str) -> Handler:
        async def handler(self: Any, stream: Stream[Any, Any]) -> None:
            metadata = {k: str(v) for k, v in (stream.metadata or {}).items()}
            async with self.ledger.call(self.server, rpc, metadata, None, lambda *_: None):
                raise GRPCError(Status.UNIMPLEMENTED, f"{rpc} is not served by the Modal stand-in")

        handler.__name__ = rpc
        return handler

    for rpc in getattr(cls, "__abstractmethods__", ()):
        setattr(cls, rpc, unimplemented(rpc))
    return abc.update_abstractmethods(cls)


# -- ids and tokens ------------------------------------------------------------------------------


def new_id(prefix: str, length: int = 22) -> str:
    """``prefix-`` and ``length`` letters and digits (Modal's ids: ``sb-``, ``ta-``, ``im-``, ``ap-``...)."""
    return f"{prefix}-" + "".join(secrets.choice(_ALNUM) for _ in range(length))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def make_jwt(claims: Mapping[str, Any], lifetime_s: float = 3600) -> str:
    """A JWT with ``exp`` ``lifetime_s`` from now and a random signature (the SDK reads, never checks, it)."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = _b64(json.dumps({**claims, "iat": int(time.time()), "exp": int(time.time() + lifetime_s)}).encode())
    return f"{header}.{payload}.{_b64(secrets.token_bytes(24))}"


def refuse(message: str) -> GRPCError:
    return GRPCError(Status.UNAUTHENTICATED, message)


def not_found(what: str) -> GRPCError:
    return GRPCError(Status.NOT_FOUND, f"{what} not found")
