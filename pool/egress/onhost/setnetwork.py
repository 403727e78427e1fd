"""``sandbox.set_network`` for backends whose sandboxes run on this machine (local, Docker).

Both put a gate of the backend's egress proxy into the sandbox's network namespace through a
:class:`~pool.egress.onhost.gatekeeper.Gatekeeper`; they differ only in how they find the namespace
(the pid of a process in it). What is common lives here: refusing a policy that needs the proxy
where the backend cannot reach into its sandboxes, and the CA bundle's file access.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pool.egress.onhost.gatekeeper import Gatekeeper
from pool.egress.onhost.service import EgressService
from pool.errors import FileOperationError, UnsupportedError
from pool.network.policy import NetworkPolicy, Phase

_MAX_BUNDLE_BYTES = 16 << 20


class SandboxFiles(Protocol):
    """The file access the CA bundle needs (every Sandbox has it)."""

    def read_file(self, path: str, *, max_bytes: int | None = None, follow_symlinks: bool = True) -> bytes: ...

    def write_file(self, path: str, data: str | bytes, *, mode: int | None = None) -> None: ...


def set_network(
    sandbox: SandboxFiles,
    policy: NetworkPolicy,
    phase: Phase,
    *,
    egress: EgressService,
    gatekeeper: Gatekeeper,
    netns_pid: Callable[[], int],
) -> dict[str, str]:
    """Give ``sandbox`` the network ``policy`` allows in ``phase``; returns its commands' variables.

    Args:
        egress: the backend's egress service.
        gatekeeper: the sandbox's own (from ``egress.gatekeeper()``).
        netns_pid: a process in the sandbox's network namespace (raising when it is not running);
            asked only when the proxy is to be attached.

    Raises:
        UnsupportedError: the backend cannot reach into its sandboxes and the policy is not no-network.
    """
    if not egress.available:
        if policy.allows_any:
            raise UnsupportedError(egress.unavailable_reason)
        return {}

    def read_optional(path: str) -> bytes | None:
        try:
            return sandbox.read_file(path, max_bytes=_MAX_BUNDLE_BYTES)
        except FileOperationError:
            return None

    def write(path: str, data: bytes) -> None:
        sandbox.write_file(path, data, mode=0o644)

    return gatekeeper.apply(f"/proc/{netns_pid()}/ns/net", policy, phase, read_file=read_optional, write_file=write)
