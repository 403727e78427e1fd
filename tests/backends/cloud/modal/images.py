"""Image builds for the Modal stand-in: what ``Image.from_registry`` asks Modal's image builder.

The SDK hydrates a registry image at ``Sandbox.create(image=...)``: it reads the workspace's image
builder version (``EnvironmentGetOrCreate``), makes the registry secret (``SecretGetOrCreate``,
``REGISTRY_USERNAME``/``REGISTRY_PASSWORD``), sends the definition (``ImageGetOrCreate``: the
Dockerfile commands, for builder versions after 2024.10 just ``FROM <reference>``, and the
``ImageRegistryConfig`` naming the secret) and, unless the answer already carries the result of a
finished build, follows the build (``ImageJoinStreaming``: logs, then a ``GenericResult``).

Like Modal, the stand-in keeps one image per definition: a second ``ImageGetOrCreate`` of the same
definition answers the same image id with the build's result, and builds nothing (a failed build
is not kept: asking again builds again). A build pulls for real: a local template
``Template(base=<reference>)`` built by the stand-in's local backend, which fetches the image with
skopeo. An image that cannot be pulled ends the build with ``GENERIC_STATUS_FAILURE`` and the
reason in ``exception``, which the SDK raises as ``ImageBuildError``. Definitions other than a
registry image (``debian_slim``, ``pip_install``, ``add_python``: a build of commands) answer
UNIMPLEMENTED. The registry credentials are checked for their keys and recorded
(:attr:`BuildRecord.registry_username`); the pull itself uses the local backend's registry settings.
PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from grpclib import GRPCError, Status
from modal_proto import api_pb2

from pool import Template
from pool.errors import SnapgymError
from tests.backends.cloud.modal.wire import new_id

if TYPE_CHECKING:
    from tests.backends.cloud.modal.standin import ModalStandin

BUILDER_VERSION = "2025.06"
"""The image builder version the stand-in's workspace reports (Modal's dashboard setting)."""
_STATIC = api_pb2.REGISTRY_AUTH_TYPE_STATIC_CREDS


@dataclass(frozen=True, slots=True)
class BuildRecord:
    """One image build the stand-in ran (a cache hit is not a build)."""

    image_id: str
    reference: str
    registry_username: str | None
    """The user name of the registry secret (its password is never kept)."""
    started_at: float


@dataclass(slots=True)
class _Build:
    record: BuildRecord
    done: concurrent.futures.Future[api_pb2.GenericResult] = field(default_factory=concurrent.futures.Future)
    metadata: api_pb2.ImageMetadata | None = None


class ImageBuilds:
    """The stand-in's image builder: images by definition, builds by image id."""

    def __init__(self, standin: ModalStandin) -> None:
        self.standin = standin
        self._by_definition: dict[bytes, str] = {}
        self._builds: dict[str, _Build] = {}
        self._lock = threading.Lock()

    def records(self) -> list[BuildRecord]:
        """Every build started, oldest first."""
        with self._lock:
            return [build.record for build in self._builds.values()]

    def get_or_create(self, request: api_pb2.ImageGetOrCreateRequest) -> api_pb2.ImageGetOrCreateResponse:
        """The image of ``request``'s definition: a finished one with its result, else one building."""
        reference = _reference(request.image)
        key = request.image.SerializeToString(deterministic=True)
        with self._lock:
            known = self._by_definition.get(key)
            build = self._builds.get(known) if known and not request.force_build else None
            if build is not None and build.done.done() and self.standin.image(build.record.image_id) is None:
                build = None  # the image expired (ModalStandin.expire_image): built again
            if build is not None and build.done.done():
                meta = build.metadata
                return api_pb2.ImageGetOrCreateResponse(image_id=build.record.image_id, result=build.done.result(),
                                                        metadata=meta)  # fmt: skip
            if build is not None:
                return api_pb2.ImageGetOrCreateResponse(image_id=build.record.image_id)
        username = self._username(request.image.image_registry_config)
        record = BuildRecord(new_id("im"), reference, username, time.time())
        build = _Build(record)
        build.done.set_running_or_notify_cancel()  # so a join that gives up cannot cancel the build
        with self._lock:
            self._by_definition[key] = record.image_id
            self._builds[record.image_id] = build
        threading.Thread(target=self._build, args=(build, key), name="modal-image-build", daemon=True).start()
        return api_pb2.ImageGetOrCreateResponse(image_id=record.image_id)

    async def join(
        self, request: api_pb2.ImageJoinStreamingRequest
    ) -> AsyncIterator[api_pb2.ImageJoinStreamingResponse]:
        """The build's log, then its result; nothing more if it is still building at ``timeout``
        (the SDK joins again from ``last_entry_id``)."""
        with self._lock:
            build = self._builds.get(request.image_id)
        if build is None:
            raise GRPCError(Status.NOT_FOUND, f"Image {request.image_id} not found")
        if not request.last_entry_id:
            line = api_pb2.TaskLogs(
                data=f"Pulling {build.record.reference}\n", file_descriptor=api_pb2.FILE_DESCRIPTOR_STDOUT
            )
            yield api_pb2.ImageJoinStreamingResponse(task_logs=[line], entry_id="1")
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(build.done), timeout=max(request.timeout, 1.0))
        except TimeoutError:
            return
        yield api_pb2.ImageJoinStreamingResponse(result=result, metadata=build.metadata, entry_id="2", eof=True)

    # -- helpers -------------------------------------------------------------------------------

    def _username(self, config: api_pb2.ImageRegistryConfig) -> str | None:
        """The user name of the registry secret (checked for both keys), if any."""
        if not config.secret_id:
            return None
        env = self.standin.secret(config.secret_id)
        if env is None:
            raise GRPCError(Status.NOT_FOUND, f"Secret {config.secret_id} not found")
        if config.registry_auth_type != _STATIC:
            raise GRPCError(Status.UNIMPLEMENTED, "the Modal stand-in pulls with REGISTRY_USERNAME/PASSWORD only")
        if not env.get("REGISTRY_USERNAME") or not env.get("REGISTRY_PASSWORD"):
            raise GRPCError(
                Status.INVALID_ARGUMENT, "the registry secret needs REGISTRY_USERNAME and REGISTRY_PASSWORD"
            )
        return env["REGISTRY_USERNAME"]

    def _build(self, build: _Build, key: bytes) -> None:
        """Pull the image into a local template; a failure is the build's result (and is not kept)."""
        record = build.record
        name = "modal-image-" + hashlib.sha256(record.reference.encode()).hexdigest()[:16]
        try:
            snapshot = self.standin.backend.build(Template(name=name, base=record.reference))
        except SnapgymError as exc:
            with self._lock:
                self._by_definition.pop(key, None)
            failed = api_pb2.GenericResult.GENERIC_STATUS_FAILURE
            build.done.set_result(api_pb2.GenericResult(status=failed, exception=str(exc)))
            return
        self.standin.add_image(snapshot, "registry", image_id=record.image_id)
        build.metadata = api_pb2.ImageMetadata(workdir=snapshot.workdir, image_builder_version=BUILDER_VERSION)
        build.done.set_result(api_pb2.GenericResult(status=api_pb2.GenericResult.GENERIC_STATUS_SUCCESS))


def _reference(image: api_pb2.Image) -> str:
    """The reference of a registry image's definition (UNIMPLEMENTED: another kind of image)."""
    commands = list(image.dockerfile_commands)
    other = image.base_images or image.context_files or image.context_mount_id or image.HasField("build_function")
    if other or image.secret_ids or len(commands) != 1 or not commands[0].startswith("FROM "):
        raise GRPCError(
            Status.UNIMPLEMENTED,
            "the Modal stand-in builds only registry images (Image.from_registry without add_python or setup "
            f"commands), not an image of {len(commands)} Dockerfile commands from {commands[:1]}",
        )
    return commands[0].removeprefix("FROM ").strip()
