"""The Modal stand-in's API server (``modal_proto.api_grpc.ModalClientBase``): what the SDK asks
Modal's control plane for a sandbox backend, over the stand-in's state (:mod:`modal_standin`).

Every call must carry the stand-in's ``x-modal-token-id``/``x-modal-token-secret``; ``*V2`` calls
and ``SandboxGetCommandRouterAccess`` must also carry an ``x-modal-auth-token`` from
``AuthTokenGet``. A V2 sandbox id is ``sb-`` and 24 characters and its task id ends in ``V``; a V1
one (GPU) is ``sb-`` and 22, which is how the SDK tells them apart. PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import threading
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

from google.protobuf import empty_pb2
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from grpclib import GRPCError, Status
from modal_proto import api_pb2
from modal_proto.api_grpc import ModalClientBase

from pool.errors import UnsupportedError
from pool.network.policy import NetworkPolicy, Phase
from tests.backends.cloud.modal.images import BUILDER_VERSION
from tests.backends.cloud.modal.wire import (
    NETWORK,
    SandboxRecord,
    make_jwt,
    new_id,
    not_found,
    refuse,
    replies,
    serve_the_rest,
    unary,
)

if TYPE_CHECKING:
    from pool.backends.local import LocalSandbox
    from tests.backends.cloud.modal.standin import Box, ModalStandin

LIST_PAGE = 100
"""Sandboxes per SandboxList(V2) page; the SDK asks again with ``before_timestamp`` until a page is empty."""
_ENTRYPOINT_GRACE_S = 5
"""An entrypoint's own timeout is the lifetime plus this, so the reaper (``timeout``) ends it first."""
_ENTRYPOINT_START_S = 10.0
"""How long a create waits for the entrypoint to be running."""
_V2_EXTRA = {"SandboxGetCommandRouterAccess"}
"""Calls besides ``*V2`` that need the auth token."""


def result_of(record: SandboxRecord) -> api_pb2.GenericResult | None:
    """How a finished sandbox ended, as the SDK reads it (``wait`` raises on TIMEOUT and TERMINATED)."""
    if record.state == "running":
        return None
    if record.ended_by == "timeout":
        return api_pb2.GenericResult(status=api_pb2.GenericResult.GENERIC_STATUS_TIMEOUT)
    if record.ended_by == "exit":
        ok = record.exit_code == 0
        status = api_pb2.GenericResult.GENERIC_STATUS_SUCCESS if ok else api_pb2.GenericResult.GENERIC_STATUS_FAILURE
        return api_pb2.GenericResult(status=status, exitcode=record.exit_code or 0)
    return api_pb2.GenericResult(status=api_pb2.GenericResult.GENERIC_STATUS_TERMINATED)


@serve_the_rest
class ControlPlane(ModalClientBase):
    """The API server; RPCs it does not define answer UNIMPLEMENTED."""

    server = "control"

    def __init__(self, standin: ModalStandin) -> None:
        self.standin = standin
        self.ledger = standin.ledger
        self._auth_tokens: set[str] = set()
        self._lock = threading.Lock()

    def authorize(self, rpc: str, metadata: Mapping[str, str], request: Message | None) -> None:
        s = self.standin
        if metadata.get("x-modal-token-id") != s.token_id or metadata.get("x-modal-token-secret") != s.token_secret:
            raise refuse("Token ID or secret is invalid. Check your Modal credentials.")
        if rpc.endswith("V2") or rpc in _V2_EXTRA:
            with self._lock:
                if metadata.get("x-modal-auth-token") not in self._auth_tokens:
                    raise refuse("missing or unknown x-modal-auth-token")

    # -- session, apps, images, secrets --------------------------------------------------------

    @unary
    async def ClientHello(self, request: Message, metadata: dict[str, str]) -> api_pb2.ClientHelloResponse:
        return api_pb2.ClientHelloResponse()

    @unary
    async def AuthTokenGet(self, request: Message, metadata: dict[str, str]) -> api_pb2.AuthTokenGetResponse:
        token = make_jwt({"sub": self.standin.token_id})
        with self._lock:
            self._auth_tokens.add(token)
        return api_pb2.AuthTokenGetResponse(token=token)

    @unary
    async def AppGetOrCreate(
        self, request: api_pb2.AppGetOrCreateRequest, metadata: dict[str, str]
    ) -> api_pb2.AppGetOrCreateResponse:
        create = request.object_creation_type == api_pb2.OBJECT_CREATION_TYPE_CREATE_IF_MISSING
        app_id = self.standin.app_id(request.app_name, create=create)
        if app_id is None:
            raise not_found(f"App '{request.app_name}'")
        handle = api_pb2.AppHandleMetadata(app_id=app_id, environment_name=request.environment_name)
        return api_pb2.AppGetOrCreateResponse(app_id=app_id, handle_metadata=handle)

    @unary
    async def ImageFromId(self, request: api_pb2.ImageFromIdRequest, metadata: dict[str, str]) -> Message:
        image = self.standin.image(request.image_id)
        if image is None:
            raise not_found(f"Image {request.image_id}")
        meta = api_pb2.ImageMetadata(workdir=image.snapshot.workdir)
        return api_pb2.ImageFromIdResponse(image_id=image.image_id, metadata=meta)

    @unary
    async def SecretGetOrCreate(self, request: api_pb2.SecretGetOrCreateRequest, metadata: dict[str, str]) -> Message:
        if not request.env_dict:
            raise not_found(f"Secret '{request.deployment_name}'")
        secret_id = self.standin.add_secret(dict(request.env_dict))
        keys = sorted(request.env_dict)  # the SDK reads a registry secret's kind from its keys
        return api_pb2.SecretGetOrCreateResponse(secret_id=secret_id, metadata=api_pb2.SecretMetadata(keys=keys))

    @unary
    async def EnvironmentGetOrCreate(
        self, request: api_pb2.EnvironmentGetOrCreateRequest, metadata: dict[str, str]
    ) -> Message:
        settings = api_pb2.EnvironmentSettings(image_builder_version=BUILDER_VERSION)
        meta = api_pb2.EnvironmentMetadata(name=request.deployment_name or "main", settings=settings)
        return api_pb2.EnvironmentGetOrCreateResponse(environment_id=new_id("en"), metadata=meta)

    @unary
    async def ImageGetOrCreate(self, request: api_pb2.ImageGetOrCreateRequest, metadata: dict[str, str]) -> Message:
        if self.standin.app_name(request.app_id) is None:
            raise not_found(f"App {request.app_id}")
        return self.standin.builds.get_or_create(request)

    @replies
    async def ImageJoinStreaming(
        self, request: api_pb2.ImageJoinStreamingRequest, metadata: dict[str, str]
    ) -> AsyncIterator[api_pb2.ImageJoinStreamingResponse]:
        async for reply in self.standin.builds.join(request):
            yield reply

    # -- create --------------------------------------------------------------------------------

    @unary
    async def SandboxCreateV2(self, request: api_pb2.SandboxCreateV2Request, metadata: dict[str, str]) -> Message:
        box = await self._create(request, request.secret_sources, api="v2")
        task_id = box.record.task_id
        access = api_pb2.CommandRouterAccess(url=self.standin.router_url, jwt=self.standin.router_jwt(task_id))
        return api_pb2.SandboxCreateV2Response(
            sandbox_id=box.record.sandbox_id, task_id=task_id, metadata=self._handle(box), command_router_access=access
        )

    @unary
    async def SandboxCreate(self, request: api_pb2.SandboxCreateRequest, metadata: dict[str, str]) -> Message:
        box = await self._create(request, [], api="v1")
        return api_pb2.SandboxCreateResponse(sandbox_id=box.record.sandbox_id, metadata=self._handle(box))

    async def _create(self, request: Message, sources: list[api_pb2.SecretSource], *, api: str) -> Box:
        s = self.standin
        if not s.take_create_slot():
            retry = s.rate_limit_retry_after_s
            details = [api_pb2.RPCRetryPolicy(retry_after_secs=retry)] if retry is not None else None
            raise GRPCError(Status.RESOURCE_EXHAUSTED, "sandbox creation rate limit exceeded", details)
        d: api_pb2.Sandbox = request.definition
        app_id: str = request.app_id
        if s.app_name(app_id) is None:
            raise not_found(f"App {app_id}")
        image = s.image(d.image_id)
        if image is None:
            raise GRPCError(Status.NOT_FOUND, f"Image {d.image_id!r} not found (the stand-in serves Image.from_id)")
        name = d.name if d.HasField("name") else None
        if name and self._named(app_id, name, running=True):
            raise GRPCError(Status.ALREADY_EXISTS, f"Sandbox with name '{name}' already exists")
        env = s.env_of(list(d.secret_ids), sources)
        workdir = d.workdir if d.HasField("workdir") else image.snapshot.workdir
        local = await asyncio.to_thread(s.backend.create, image.snapshot)
        if d.HasField("workdir"):
            await asyncio.to_thread(local.exec, f"mkdir -p {shlex.quote(workdir)}")
        network = "blocked" if d.block_network else NETWORK.get(d.network_access.network_access_type, "open")
        if network == "open":  # through the local backend's egress proxy (its commands get HTTP_PROXY)
            with contextlib.suppress(UnsupportedError):  # a rootless local backend: recorded only
                await asyncio.to_thread(local.set_network, NetworkPolicy.public(), phase=Phase.AGENT)
        gpu = d.resources.gpu_config if d.resources.gpu_config.gpu_type else None
        now = time.time()
        v1 = api == "v1"
        record = SandboxRecord(
            sandbox_id=new_id("sb", 22 if v1 else 24),
            task_id=new_id("ta", 21) + ("k" if v1 else "V"),
            app_id=app_id,
            api=api,
            image_id=image.image_id,
            name=name,
            tags={t.tag_name: t.tag_value for t in request.tags},
            env=env,
            workdir=workdir,
            entrypoint=tuple(d.entrypoint_args),
            timeout_s=d.timeout_secs,
            gpu=(gpu.gpu_type if gpu.count <= 1 else f"{gpu.gpu_type}:{gpu.count}") if gpu else None,
            cpu=d.resources.milli_cpu / 1000 if d.resources.milli_cpu else None,
            memory_mb=d.resources.memory_mb or None,
            network=network,
            outbound_cidrs=tuple(d.network_access.allowed_cidrs),
            outbound_domains=tuple(d.network_access.allowed_domains),
            network_changes=(),
            definition=MessageToDict(d, preserving_proto_field_name=True),
            created_at=now,
            end_at=now + d.timeout_secs,
        )
        python3 = image.kind == "base" or (await asyncio.to_thread(local.exec, "command -v python3")).ok
        box = s.add_box(record, local, python3=python3)
        if record.entrypoint:
            started = f"/tmp/.modal-entrypoint-{record.sandbox_id}"
            args = (box, local, record.timeout_s + _ENTRYPOINT_GRACE_S, started)
            threading.Thread(target=self._entrypoint, args=args, name="modal-entrypoint", daemon=True).start()
            deadline = time.monotonic() + _ENTRYPOINT_START_S  # as at Modal: the entrypoint runs before any exec
            while not local.exec(f"test -e {started}", timeout_s=5).ok and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        return box

    def _entrypoint(self, box: Box, local: LocalSandbox, timeout_s: int, started: str) -> None:
        """Run the sandbox's entrypoint; its end ends the sandbox (unless something ended it first)."""
        record = box.record
        command = f"touch {started} && exec {shlex.join(record.entrypoint)}"
        try:
            result = local.exec(command, timeout_s=timeout_s, cwd=record.workdir, env=record.env)
        except Exception:  # terminated or closed under it
            return
        self.standin.end_box(box, "exit", result.exit_code)

    # -- find, wait, terminate -----------------------------------------------------------------

    def _box(self, sandbox_id: str = "", task_id: str = "") -> Box:
        box = self.standin.box(sandbox_id) if sandbox_id else self.standin.box_for_task(task_id)
        if box is None:
            raise not_found(f"Sandbox {sandbox_id or task_id}")
        return box

    def _handle(self, box: Box) -> api_pb2.SandboxHandleMetadata:
        result = result_of(box.record)
        return api_pb2.SandboxHandleMetadata(app_id=box.record.app_id, result=result)

    def _named(self, app_id: str, name: str, *, running: bool) -> Box | None:
        found = [
            b
            for b in self.standin.all_boxes()
            if b.record.app_id == app_id and b.record.name == name and (b.record.state == "running" or not running)
        ]
        return max(found, key=lambda b: b.record.created_at) if found else None

    @unary
    async def SandboxGetTaskId(self, request: api_pb2.SandboxGetTaskIdRequest, metadata: dict[str, str]) -> Message:
        return self._task_id(request)

    @unary
    async def SandboxGetTaskIdV2(self, request: api_pb2.SandboxGetTaskIdRequest, metadata: dict[str, str]) -> Message:
        return self._task_id(request)

    def _task_id(self, request: api_pb2.SandboxGetTaskIdRequest) -> api_pb2.SandboxGetTaskIdResponse:
        box = self._box(request.sandbox_id)
        return api_pb2.SandboxGetTaskIdResponse(task_id=box.record.task_id, task_result=result_of(box.record))

    @unary
    async def TaskGetCommandRouterAccess(
        self, request: api_pb2.TaskGetCommandRouterAccessRequest, metadata: dict[str, str]
    ) -> Message:
        jwt, url = self._access(self._box(task_id=request.task_id))
        return api_pb2.TaskGetCommandRouterAccessResponse(jwt=jwt, url=url)

    @unary
    async def SandboxGetCommandRouterAccess(
        self, request: api_pb2.SandboxGetCommandRouterAccessRequest, metadata: dict[str, str]
    ) -> Message:
        jwt, url = self._access(self._box(request.sandbox_id, request.task_id))
        return api_pb2.SandboxGetCommandRouterAccessResponse(jwt=jwt, url=url)

    def _access(self, box: Box) -> tuple[str, str]:
        if box.record.state != "running":
            raise GRPCError(Status.FAILED_PRECONDITION, f"Sandbox {box.record.sandbox_id} has already finished")
        return self.standin.router_jwt(box.record.task_id), self.standin.router_url

    @unary
    async def SandboxWait(self, request: api_pb2.SandboxWaitRequest, metadata: dict[str, str]) -> Message:
        return await self._wait(request)

    @unary
    async def SandboxWaitV2(self, request: api_pb2.SandboxWaitRequest, metadata: dict[str, str]) -> Message:
        return await self._wait(request)

    async def _wait(self, request: api_pb2.SandboxWaitRequest) -> api_pb2.SandboxWaitResponse:
        box = self._box(request.sandbox_id)
        deadline = time.monotonic() + max(request.timeout, 0.0)
        while box.record.state == "running" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return api_pb2.SandboxWaitResponse(result=result_of(box.record), metadata=self._handle(box))

    @unary
    async def SandboxTerminate(self, request: api_pb2.SandboxTerminateRequest, metadata: dict[str, str]) -> Message:
        return await self._terminate(request)

    @unary
    async def SandboxTerminateV2(self, request: api_pb2.SandboxTerminateRequest, metadata: dict[str, str]) -> Message:
        return await self._terminate(request)

    async def _terminate(self, request: api_pb2.SandboxTerminateRequest) -> api_pb2.SandboxTerminateResponse:
        box = self._box(request.sandbox_id)
        ended = await asyncio.to_thread(self.standin.end_box, box, "terminate")
        return api_pb2.SandboxTerminateResponse(existing_result=None if ended else result_of(box.record))

    @unary
    async def SandboxGetFromName(self, request: api_pb2.SandboxGetFromNameRequest, metadata: dict[str, str]) -> Message:
        return self._from_name(request)

    @unary
    async def SandboxGetFromNameV2(
        self, request: api_pb2.SandboxGetFromNameRequest, metadata: dict[str, str]
    ) -> Message:
        return self._from_name(request)

    def _from_name(self, request: api_pb2.SandboxGetFromNameRequest) -> api_pb2.SandboxGetFromNameResponse:
        app_id = self.standin.app_id(request.app_name, create=False)
        box = self._named(app_id, request.sandbox_name, running=not request.include_terminated) if app_id else None
        if box is None:
            raise not_found(f"Sandbox '{request.sandbox_name}' in app '{request.app_name}'")
        return api_pb2.SandboxGetFromNameResponse(sandbox_id=box.record.sandbox_id, metadata=self._handle(box))

    # -- list and tags -------------------------------------------------------------------------

    @unary
    async def SandboxList(self, request: api_pb2.SandboxListRequest, metadata: dict[str, str]) -> Message:
        return self._list(request)

    @unary
    async def SandboxListV2(self, request: api_pb2.SandboxListRequest, metadata: dict[str, str]) -> Message:
        return self._list(request)

    def _list(self, request: api_pb2.SandboxListRequest) -> api_pb2.SandboxListResponse:
        """Newest first, at most :data:`LIST_PAGE`, older than ``before_timestamp`` when it is set;
        running ones unless ``include_finished``; having at least the asked ``tags``."""
        wanted = {t.tag_name: t.tag_value for t in request.tags}
        records = [
            r
            for r in (b.record for b in self.standin.all_boxes())
            if request.app_id in ("", r.app_id)
            and (request.include_finished or r.state == "running")
            and wanted.items() <= r.tags.items()
            and (not request.before_timestamp or r.created_at < request.before_timestamp)
        ]
        records.sort(key=lambda r: r.created_at, reverse=True)
        return api_pb2.SandboxListResponse(sandboxes=[self._info(r) for r in records[:LIST_PAGE]])

    def _info(self, r: SandboxRecord) -> api_pb2.SandboxInfo:
        result = result_of(r)
        task = api_pb2.TaskInfo(id=r.task_id, sandbox_id=r.sandbox_id, started_at=r.created_at, result=result)
        if r.gpu:
            task.gpu_type = r.gpu
        return api_pb2.SandboxInfo(
            id=r.sandbox_id,
            created_at=r.created_at,
            app_id=r.app_id,
            tags=[api_pb2.SandboxTag(tag_name=k, tag_value=v) for k, v in r.tags.items()],
            name=r.name or "",
            image_id=r.image_id,
            timeout_secs=r.timeout_s,
            task_info=task,
            metadata=api_pb2.SandboxHandleMetadata(app_id=r.app_id, result=result),
        )

    @unary
    async def SandboxTagsGet(self, request: api_pb2.SandboxTagsGetRequest, metadata: dict[str, str]) -> Message:
        return self._tags(request.sandbox_id)

    @unary
    async def SandboxTagsGetV2(self, request: api_pb2.SandboxTagsGetRequest, metadata: dict[str, str]) -> Message:
        return self._tags(request.sandbox_id)

    def _tags(self, sandbox_id: str) -> api_pb2.SandboxTagsGetResponse:
        tags = self._box(sandbox_id).record.tags
        return api_pb2.SandboxTagsGetResponse(
            tags=[api_pb2.SandboxTag(tag_name=k, tag_value=v) for k, v in tags.items()]
        )

    @unary
    async def SandboxTagsSet(self, request: api_pb2.SandboxTagsSetRequest, metadata: dict[str, str]) -> Message:
        return self._set_tags(request)

    @unary
    async def SandboxTagsSetV2(self, request: api_pb2.SandboxTagsSetRequest, metadata: dict[str, str]) -> Message:
        return self._set_tags(request)

    def _set_tags(self, request: api_pb2.SandboxTagsSetRequest) -> Message:
        """Tags are replaced as a whole (the SDK's ``set_tags`` says so)."""
        box = self._box(request.sandbox_id)
        self.standin.set_tags(box, {t.tag_name: t.tag_value for t in request.tags})
        return empty_pb2.Empty()
