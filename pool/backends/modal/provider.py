"""Modal through its SDK, as a :class:`~pool.backends.remote.provider.Provider`: with :mod:`.images`,
the only modules that call ``modal``.

A sandbox runs ``sleep infinity`` under an app (``app_name``) from an image id:
the base image, a filesystem snapshot (``snapshot_filesystem``), or a task's registry
image (a template's build: ``Image.from_registry``, see :mod:`.images`), with the
request's CPUs and memory (``cpu``, ``memory``: each Modal's request and hard limit) and GPUs
(``gpu``); Modal sandboxes take no disk size. Commands run
as ``bash -c`` through Modal's exec, each stream cut at the cap inside the
sandbox (:mod:`pool.backends.remote.capped`) and read as bytes (the SDK's text mode decodes
strictly and raises on output that is not UTF-8); a script longer than the SDK takes as
arguments (64 KiB, checked in the client) is written through the file API and run from there.
Tags are set by the create itself, so a sandbox is never without its labels. A create is named ``sg-<key>`` (names are
unique within an app), so a retry whose first answer was lost takes that
sandbox. Modal images have no names to find them by, so a build's image id is
remembered in a small registry file on this machine (``registry_file``). Modal expires snapshot
images (30 days by default): a create from an image that is gone raises
:class:`~pool.errors.SnapshotNotFoundError` (not a crashed sandbox) and forgets the image, so the
next build of its template makes it anew. The image Modal built of a registry image is remembered
there too, by the image's key, and built again if Modal no longer has it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import modal
import modal.exception as mx

from pool.backends.modal.errors import provider_errors
from pool.backends.modal.images import build_failed, registry_image
from pool.backends.modal.network import outbound_policy
from pool.backends.remote.capped import LONG_SCRIPT_BYTES, capped_script, cut, run_from_file, script_file
from pool.backends.remote.provider import CreateRequest, Listed, ProviderImage, RawResult
from pool.errors import SnapshotNotFoundError, UnsupportedError
from pool.network.policy import NetworkPolicy
from pool.resources import Resources

IMAGE_PREFIX = "image-"
"""Registry file names of Modal images of registry images (``image-<ProviderImage.key>``); snapshot
names start ``snapgym-``, so :meth:`ModalProvider.find_snapshot` never takes one."""


class ModalProvider:
    """Modal sandboxes (GPU ones too), created from image ids, networked only as the build asks."""

    name = "modal"
    applied_resources: frozenset[str] = frozenset({"cpus", "memory_mb", "gpus"})
    applied_on_base: frozenset[str] = applied_resources  # every create takes them
    """Modal's ``cpu``, ``memory`` and ``gpu``; Modal sandboxes take no disk size."""

    def __init__(
        self, client: Any, *, app_name: str, base_image: str, lifetime_s: int, gpu: str | None, registry: Path
    ) -> None:
        self.client = client
        self.lifetime_s = lifetime_s
        self.default_gpu = gpu
        self.registry = registry
        self._base_image = base_image
        self._lock = threading.Lock()
        self._widened: weakref.WeakSet[Any] = weakref.WeakSet()
        """Sandboxes whose policy was replaced: ``no-network`` must then be set, not assumed."""
        self.app_name = app_name
        with provider_errors(f"looking up the app {app_name}"):
            self.app = modal.App.lookup(app_name, create_if_missing=True, client=client)

    def create(self, request: CreateRequest) -> Any:
        if request.image is not None:
            return self._create_from_image(request, request.image)
        source = request.source or self._base_image
        with provider_errors(f"creating a sandbox from {source}"):
            image = self._image(source)
            try:
                return self._start(request, image)
            except mx.NotFoundError as exc:
                if not source.startswith("im-"):
                    raise
                self._forget(source)  # the next build makes it anew
                raise SnapshotNotFoundError(
                    f"Modal no longer has the image {source} ({exc}; snapshot images expire, 30 days by default): "
                    "build the template again, backend.build() makes it anew"
                ) from None

    def sandbox_id(self, remote: Any) -> str:
        return str(remote.object_id)

    def is_running(self, remote: Any) -> bool:
        return remote.poll() is None

    def ended_from_inside(self, remote: Any) -> str | None:
        """How the sandbox ended, if its own processes ended it: it has finished, and Modal's ``wait``
        says it was neither terminated nor timed out, so its entrypoint exited (or the kernel killed it
        for memory), with this code. The SDK does not tell Modal's own rare ends (a lost worker, an
        eviction) apart from these in public; they are counted the same."""
        try:
            code = remote.poll()
            if code is None:
                return None
            remote.wait(raise_on_termination=True)
        except mx.Error:  # SandboxTerminatedError, SandboxTimeoutError: the provider ended it
            return None
        return f"its entrypoint exited with code {code}"

    def kill(self, remote: Any) -> None:
        with provider_errors("terminating a sandbox"), contextlib.suppress(mx.NotFoundError):
            remote.terminate()

    def run(self, remote: Any, command: str, *, cwd: str, env: Mapping[str, str], timeout_s: float,
            cap: int) -> RawResult:  # fmt: skip
        script = capped_script(command, cwd=cwd, env=env, cap=cap)
        if len(script.encode()) > LONG_SCRIPT_BYTES:  # the SDK refuses arguments over 64 KiB
            path = script_file()
            with provider_errors("writing a long command's script", file_operation=True):
                remote.filesystem.write_bytes(script.encode(), path)
            script = run_from_file(path)
        with provider_errors("running a command"):
            process = remote.exec("bash", "-c", script, timeout=math.ceil(timeout_s), text=False)
            code = process.wait()
            stdout, stdout_cut = cut(process.stdout.read(), cap)
            stderr, stderr_cut = cut(process.stderr.read(), cap)
        if code == -1:  # Modal's exec timeout: no exit status
            return RawResult(137, stdout, stderr, stdout_cut, stderr_cut, lost=True)
        return RawResult(int(code), stdout, stderr, stdout_cut, stderr_cut)

    def read(self, remote: Any, path: str) -> bytes:
        with provider_errors(f"reading {path}", file_operation=True):
            return bytes(remote.filesystem.read_bytes(path))

    def write(self, remote: Any, path: str, data: bytes) -> None:
        with provider_errors(f"writing {path}", file_operation=True):
            remote.filesystem.write_bytes(data, path)

    def make_snapshot(self, remote: Any, name: str | None) -> str:
        with provider_errors("snapshotting a sandbox's filesystem"):
            image_id = str(remote.snapshot_filesystem().object_id)
        if name is not None:
            self._remember(name, image_id)
        return image_id

    def find_snapshot(self, prefix: str) -> tuple[str, str] | None:
        for name, image_id in self._registry().items():
            if name.startswith(prefix):
                return image_id, name
        return None

    def set_network(self, remote: Any, policy: NetworkPolicy) -> None:
        """Replace the sandbox's outbound policy (see :mod:`.network`); a sandbox that was never widened
        stays as it was created, blocked, for ``no-network``."""
        arguments = outbound_policy(policy)
        with self._lock:
            if not policy.allows_any and remote not in self._widened:
                return
            self._widened.add(remote)
        with provider_errors(f"setting the sandbox's egress to {policy.describe()}"):
            remote._experimental_set_outbound_network_policy(**arguments)

    def listed(self, labels: Mapping[str, str]) -> Iterator[Listed]:
        with provider_errors("listing sandboxes"):
            for sandbox in modal.Sandbox.list(app_id=self.app.app_id, tags=dict(labels), client=self.client):
                try:
                    tags = sandbox.get_tags()  # a call of its own: the sandbox may have ended since the list
                except (mx.NotFoundError, mx.SandboxTerminatedError):
                    continue
                yield Listed(str(sandbox.object_id), dict(tags))

    def kill_id(self, sandbox_id: str) -> None:
        with provider_errors(f"terminating {sandbox_id}"), contextlib.suppress(mx.NotFoundError):
            modal.Sandbox.from_id(sandbox_id, client=self.client).terminate()

    def close(self) -> None:
        """The client is the backend's; nothing else to release."""

    # -- helpers --------------------------------------------------------------

    def _start(self, request: CreateRequest, image: Any) -> Any:
        """``sleep infinity`` from ``image`` with the request's resources, named after its idempotency key."""
        name = f"sg-{request.idempotency_key}"
        resources = request.resources or Resources()
        cpus, memory_mb = resources.cpus, resources.memory_mb  # each as Modal's request and its hard limit
        try:
            return modal.Sandbox.create(
                "sleep", "infinity", app=self.app, name=name, image=image, timeout=self.lifetime_s,
                block_network=not request.internet, gpu=self._gpu(resources), cpu=(cpus, cpus) if cpus else None,
                memory=(memory_mb, memory_mb) if memory_mb else None, client=self.client, tags=dict(request.labels),
            )  # fmt: skip
        except mx.AlreadyExistsError:  # a retry of a create whose answer was lost: it has its tags
            return modal.Sandbox.from_name(self.app_name, name, client=self.client)

    def _create_from_image(self, request: CreateRequest, image: ProviderImage) -> Any:
        """A sandbox from a registry image: Modal's image of it, remembered by the image's key (any
        process on this machine finds it; Modal finds it again by its definition too)."""
        name = f"{IMAGE_PREFIX}{image.key}"
        with provider_errors(f"creating a sandbox from the image {image.reference}"):
            if known := self._registry().get(name):
                try:
                    return self._start(request, modal.Image.from_id(known, client=self.client))
                except mx.NotFoundError:  # Modal no longer has it: built again below
                    self._forget(known)
            modal_image = registry_image(image)
            try:
                sandbox = self._start(request, modal_image)
            except mx.ImageBuildError as exc:
                raise build_failed(image, exc) from None
        self._remember(name, str(modal_image.object_id))
        return sandbox

    def _image(self, reference: str) -> Any:
        """An image id (``im-...``, a build or the base), ``debian_slim``, or a registry reference."""
        if reference.startswith("im-"):
            return modal.Image.from_id(reference, client=self.client)
        if reference == "debian_slim":
            return modal.Image.debian_slim()
        return modal.Image.from_registry(reference)

    def _gpu(self, resources: Resources) -> str | None:
        if not resources.gpus:
            return None
        kind = resources.gpu_types[0] if resources.gpu_types else self.default_gpu
        if kind is None:
            raise UnsupportedError("the task asks for a GPU and names no type; set the modal backend's gpu option")
        return kind if resources.gpus == 1 else f"{kind}:{resources.gpus}"

    def _registry(self) -> dict[str, str]:
        try:
            data = json.loads(self.registry.read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _remember(self, name: str, image_id: str) -> None:
        self._update(lambda known: known.__setitem__(name, image_id))

    def _forget(self, image_id: str) -> None:
        """Drop every name of an image Modal no longer has."""
        if image_id in self._registry().values():
            self._update(lambda known: [known.pop(k) for k in [k for k, v in known.items() if v == image_id]])

    def _update(self, change: Callable[[dict[str, str]], object]) -> None:
        """Change the registry file under its lock."""
        self.registry.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.registry, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.seek(0)
            try:
                known = json.loads(handle.read() or "{}")
            except ValueError:
                known = {}
            change(known)
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(known, indent=1, sort_keys=True))
            handle.flush()
            os.fsync(handle.fileno())
