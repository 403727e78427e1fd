"""E2B through its SDK, as a :class:`~pool.backends.remote.provider.Provider`: the only module that calls ``e2b``."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import e2b

from pool.backends.e2b.errors import provider_errors
from pool.backends.e2b.images import APPLIED, template_for
from pool.backends.e2b.network import provider_network
from pool.backends.remote.capped import LONG_SCRIPT_BYTES, run_from_file, script_file
from pool.backends.remote.provider import CreateRequest, Listed, RawResult
from pool.network.policy import NetworkPolicy
from pool.results import CappedBuffer

ROOT = "root"
"""Every command and file operation runs as the sandbox's root, as on the other backends."""
if logging.getLogger("httpx").level == logging.NOTSET:  # the SDK's client logs every request at INFO
    logging.getLogger("httpx").setLevel(logging.WARNING)


class E2BProvider:
    """E2B sandboxes: created from a template or snapshot, run as root, filtered by E2B's egress rules."""

    name = "e2b"
    applied_resources: frozenset[str] = APPLIED  # a template of the image is built at the task's size
    applied_on_base: frozenset[str] = frozenset()  # the base template has its own

    def __init__(self, api: Mapping[str, Any], *, base_template: str, lifetime_s: int) -> None:
        """``api``: the SDK's connection options (``api_key``, ``domain``, ``api_url``, ``sandbox_url``,
        ``request_timeout``)."""
        self.api = dict(api)
        self.base_template = base_template
        self.lifetime_s = lifetime_s

    def create(self, request: CreateRequest) -> Any:
        if request.image is not None:
            template = template_for(self.api, request.image, request.resources)
        else:
            template = request.source or self.base_template
        with provider_errors(f"creating a sandbox from {template}"):
            return e2b.Sandbox.create(
                template=template,
                timeout=self.lifetime_s,
                metadata=dict(request.labels),
                allow_internet_access=request.internet,
                idempotency_key=request.idempotency_key,
                **self.api,
            )

    def sandbox_id(self, remote: Any) -> str:
        return str(remote.sandbox_id)

    def is_running(self, remote: Any) -> bool:
        return bool(remote.is_running())

    def ended_from_inside(self, remote: Any) -> str | None:
        return None  # E2B reports no cause: a sandbox ends by its lifetime or a kill (envd is its init)

    def kill(self, remote: Any) -> None:
        with provider_errors("killing a sandbox"):
            remote.kill()

    def run(self, remote: Any, command: str, *, cwd: str, env: Mapping[str, str], timeout_s: float,
            cap: int) -> RawResult:  # fmt: skip
        """Streams the output through capped callbacks (the client keeps at most ``cap`` per stream)."""
        out, err = CappedBuffer(cap), CappedBuffer(cap)
        exit_code, lost = 0, False
        if len(command.encode()) > LONG_SCRIPT_BYTES:  # one argument of bash: the kernel's 128 KiB
            path = script_file()
            self.write(remote, path, command.encode())
            command = run_from_file(path)
        with provider_errors("running a command"):
            try:
                result = remote.commands.run(
                    command, envs=dict(env), user=ROOT, cwd=cwd, on_stdout=out.add_text, on_stderr=err.add_text,
                    timeout=timeout_s, retain_output=False,
                )  # fmt: skip
                exit_code = int(result.exit_code)
            except e2b.CommandExitException as exc:
                exit_code = int(exc.exit_code)
            except e2b.TimeoutException as exc:
                if isinstance(exc, (e2b.SandboxNotRunningException, e2b.SandboxUnreachableException)):
                    raise
                lost = True
        return RawResult(exit_code, out.text(), err.text(), out.truncated, err.truncated, lost)

    def read(self, remote: Any, path: str) -> bytes:
        with provider_errors(f"reading {path}", file_operation=True):
            return bytes(remote.files.read(path, format="bytes", user=ROOT))

    def write(self, remote: Any, path: str, data: bytes) -> None:
        with provider_errors(f"writing {path}", file_operation=True):
            remote.files.make_dir(path.rsplit("/", 1)[0] or "/", user=ROOT)
            remote.files.write(path, data, user=ROOT)

    def make_snapshot(self, remote: Any, name: str | None) -> str:
        with provider_errors("snapshotting a sandbox"):
            return str(remote.create_snapshot(name=name).snapshot_id)

    def find_snapshot(self, prefix: str) -> tuple[str, str] | None:
        with provider_errors("listing snapshots"):
            pages = e2b.Sandbox.list_snapshots(**self.api)
            while pages.has_next:
                for info in pages.next_items():
                    for full in [str(info.snapshot_id), *map(str, info.names)]:
                        bare = full.rsplit("/", 1)[-1].split(":", 1)[0]
                        if bare.startswith(prefix):
                            return str(info.snapshot_id), bare
        return None

    def set_network(self, remote: Any, policy: NetworkPolicy) -> None:
        body = provider_network(policy)
        with provider_errors("setting the network"):
            remote.update_network(body)

    def listed(self, labels: Mapping[str, str]) -> Iterator[Listed]:
        query = e2b.SandboxQuery(metadata=dict(labels)) if labels else None
        with provider_errors("listing sandboxes"):
            pages = e2b.Sandbox.list(query=query, **self.api)
            while pages.has_next:
                for info in pages.next_items():
                    yield Listed(str(info.sandbox_id), dict(info.metadata or {}))

    def kill_id(self, sandbox_id: str) -> None:
        with provider_errors(f"killing {sandbox_id}"):
            e2b.Sandbox.kill(sandbox_id, **self.api)

    def close(self) -> None:
        """Nothing to release: the SDK's connection pool is process-wide."""
