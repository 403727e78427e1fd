"""Daytona through its SDK, as a remote :class:`~pool.backends.remote.provider.Provider`.

The only module that calls ``daytona`` (:mod:`.images` makes an image create's parameters).
A create starts from a snapshot, or, for a build from a task's image, from that registry image,
with the task's resources (:mod:`.images`).

Commands run in one session per sandbox (Daytona's only call that returns stdout
and stderr apart), each in its own ``bash -c`` so nothing carries over from one
to the next; each stream is cut at the cap inside the sandbox
(:mod:`pool.backends.remote.capped`), so the client never holds more. Daytona has no idempotency key: a create is named
``sg-<key>``, and a retry that meets the name taken (the first answer was lost)
takes the sandbox that has it.
"""

from __future__ import annotations

import contextlib
import math
import shlex
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import daytona

from pool.backends.daytona.errors import provider_errors
from pool.backends.daytona.images import build_failure, refuse_credentials, sdk_resources
from pool.backends.daytona.network import provider_network
from pool.backends.remote.capped import LONG_SCRIPT_BYTES, capped_script, cut, run_from_file, script_file
from pool.backends.remote.provider import CreateRequest, Listed, RawResult
from pool.errors import SnapgymError
from pool.network.policy import NetworkPolicy

SESSION = "snapgym"


class DaytonaProvider:
    """Daytona sandboxes: created from a snapshot, run as root in a session, filtered by Daytona's egress rules."""

    name = "daytona"
    applied_resources: frozenset[str] = frozenset({"cpus", "memory_mb", "storage_mb", "gpus"})
    applied_on_base: frozenset[str] = frozenset()  # a snapshot carries its own: Daytona sizes only image creates
    """On a create from an image (a build); a sandbox from a snapshot has the snapshot's (:mod:`.images`)."""

    def __init__(self, config: Any, *, base_snapshot: str | None, lifetime_s: int, request_timeout_s: float) -> None:
        """``config``: a ``daytona.DaytonaConfig``."""
        self.client = daytona.Daytona(config)
        self.base_snapshot = base_snapshot
        self.lifetime_min = max(1, math.ceil(lifetime_s / 60))
        self.request_timeout_s = request_timeout_s
        self._sessions: set[str] = set()
        self._lock = threading.Lock()

    def create(self, request: CreateRequest) -> Any:
        name = f"sg-{request.idempotency_key}"
        common: dict[str, Any] = {
            "name": name,
            "labels": dict(request.labels),
            "network_block_all": not request.internet,
            "auto_stop_interval": self.lifetime_min,  # idle minutes, then stopped, and being ephemeral, deleted
            "ttl_minutes": self.lifetime_min,  # and never longer than the lifetime
            "ephemeral": True,
        }
        image, timeout = request.image, self.request_timeout_s
        if image is not None:
            refuse_credentials(image)
            params: Any = daytona.CreateSandboxFromImageParams(
                image=image.reference, resources=sdk_resources(request.resources), **common
            )
            what, timeout = f"creating a sandbox from image {image.reference}", self.request_timeout_s * 10  # a build
        else:
            params = daytona.CreateSandboxFromSnapshotParams(snapshot=request.source or self.base_snapshot, **common)
            what = f"creating a sandbox from {request.source or 'the base snapshot'}"
        with provider_errors(what):
            try:
                try:
                    return self.client.create(params, timeout=timeout)
                except daytona.DaytonaConflictError:  # a retry of a create whose answer was lost
                    remote = self.client.get(name)
                    remote.wait_for_sandbox_start(timeout=timeout)  # an image's build may still be running
                    return remote
            except daytona.DaytonaError as exc:
                failure = build_failure(exc, image) if image is not None else None
                if failure is None:
                    raise
                with contextlib.suppress(SnapgymError):  # Daytona keeps a failed build's sandbox until deleted
                    self.kill_id(name)
                raise failure from None

    def sandbox_id(self, remote: Any) -> str:
        return str(remote.id)

    def is_running(self, remote: Any) -> bool:
        remote.refresh_data()
        return str(remote.state).lower().endswith("started")

    def ended_from_inside(self, remote: Any) -> str | None:
        return None  # Daytona reports no cause: the toolbox daemon, not a command of ours, keeps a sandbox up

    def kill(self, remote: Any) -> None:
        with provider_errors("deleting a sandbox"), contextlib.suppress(daytona.DaytonaNotFoundError):
            self.client.delete(remote)
        with self._lock:
            self._sessions.discard(str(remote.id))

    def run(self, remote: Any, command: str, *, cwd: str, env: Mapping[str, str], timeout_s: float,
            cap: int) -> RawResult:  # fmt: skip
        script = capped_script(command, cwd=cwd, env=env, cap=cap)
        if len(script.encode()) > LONG_SCRIPT_BYTES:  # one argument of bash: the kernel's 128 KiB
            path = script_file()
            self.write(remote, path, script.encode())
            script = run_from_file(path)
        request = daytona.SessionExecuteRequest(command=f"bash -c {shlex.quote(script)}", run_async=False)
        self._session(remote)
        with provider_errors("running a command"):
            try:
                result = remote.process.execute_session_command(SESSION, request, timeout=math.ceil(timeout_s))
            except daytona.DaytonaTimeoutError:
                return RawResult(137, "", "", lost=True)
        stdout, stderr = str(result.stdout or ""), str(result.stderr or "")
        code = result.exit_code if result.exit_code is not None else 137
        (stdout, stdout_cut), (stderr, stderr_cut) = cut(stdout, cap), cut(stderr, cap)  # bytes, not characters
        return RawResult(int(code), stdout, stderr, stdout_cut, stderr_cut)

    def read(self, remote: Any, path: str) -> bytes:
        with provider_errors(f"reading {path}", file_operation=True):
            return bytes(remote.fs.download_file(path))

    def write(self, remote: Any, path: str, data: bytes) -> None:
        with provider_errors(f"writing {path}", file_operation=True):
            remote.fs.upload_file(data, path)

    def make_snapshot(self, remote: Any, name: str | None) -> str:
        if name is None:
            raise ValueError("Daytona snapshots need a name")
        with provider_errors("snapshotting a sandbox"):
            remote.create_snapshot(name, timeout=self.request_timeout_s * 10)
        return name

    def find_snapshot(self, prefix: str) -> tuple[str, str] | None:
        page = 1
        with provider_errors("listing snapshots"):
            while True:
                listing = self.client.snapshot.list(page=page, limit=100)
                for item in listing.items:
                    if str(item.name).startswith(prefix):
                        return str(item.name), str(item.name)
                if page >= int(listing.total_pages or 1):
                    return None
                page += 1

    def set_network(self, remote: Any, policy: NetworkPolicy) -> None:
        settings = provider_network(policy)
        with provider_errors("setting the network"):
            remote.update_network_settings(**settings)

    def listed(self, labels: Mapping[str, str]) -> Iterator[Listed]:
        with provider_errors("listing sandboxes"):
            for sandbox in self.client.list(daytona.ListSandboxesQuery(labels=dict(labels))):
                yield Listed(str(sandbox.id), dict(sandbox.labels or {}))

    def kill_id(self, sandbox_id: str) -> None:
        with provider_errors(f"deleting {sandbox_id}"), contextlib.suppress(daytona.DaytonaNotFoundError):
            self.client.delete(self.client.get(sandbox_id))

    def close(self) -> None:
        """Release the SDK's HTTP clients."""
        closer = getattr(self.client, "close", None)
        if callable(closer):
            closer()

    def _session(self, remote: Any) -> None:
        key = str(remote.id)
        with self._lock:
            if key in self._sessions:
                return
        with provider_errors("opening the command session"):
            remote.process.create_session(SESSION)
        with self._lock:
            self._sessions.add(key)
