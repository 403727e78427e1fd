"""What a cloud provider must offer for snapgym to pool its sandboxes: the :class:`Provider` protocol.

A cloud backend (E2B, Daytona, ...) is this protocol over the provider's SDK,
plus a constructor that takes the provider's options; everything a pool needs
on top (snapshots named by content hash, the start digest, hand-offs to warm
spares, strict verification, pacing and retries, labels and reaping) is
:mod:`pool.backends.remote`'s, the same for every provider. Each method translates the
SDK's exceptions into snapgym's error tree at the boundary, so nothing above it
sees a provider's exception: :class:`~pool.errors.ConfigError` for a refused
key or request, :class:`~pool.errors.ProviderBusyError` for a refusal for now
(429, 503), :class:`~pool.errors.SandboxCrashedError` for a sandbox that is
gone, :class:`~pool.errors.FileOperationError` (with an errno) for files,
:class:`~pool.errors.BackendError` for the rest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pool.network.policy import NetworkPolicy
from pool.resources import Resources


@dataclass(frozen=True, slots=True)
class RawResult:
    """What a provider's command run gave (the remote layer turns it into an ExecResult)."""

    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    lost: bool = False
    """The provider gave up on the call (its own timeout): no exit code came back."""


@dataclass(frozen=True, slots=True)
class Listed:
    """A sandbox as the provider lists it."""

    sandbox_id: str
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class ProviderImage:
    """A registry image a provider sandbox starts from: a task's ``docker_image`` or its Dockerfile's
    ``FROM``, resolved on the host (:mod:`pool.backends.remote.images`)."""

    reference: str
    """Where the provider pulls it from, as Docker writes it: ``host/path@sha256:<digest>`` (pinned to
    what snapgym resolved, so the provider runs exactly that) or ``host/path:tag``."""
    digest: str | None = None
    """The manifest digest snapgym resolved (None: the reference could not be resolved here)."""
    username: str | None = field(default=None, repr=False)
    """The registry's user name, where the image is private (the provider pulls with it)."""
    password: str | None = field(default=None, repr=False)
    """The registry's password or token (never printed)."""
    insecure: bool = False
    """The registry speaks plain HTTP (a private or test registry)."""

    @property
    def key(self) -> str:
        """A short name for this image, the same in every process: what a provider's own image or
        template of it is named after (the digest when known, else a hash of the reference)."""
        text = self.digest or self.reference
        return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class CreateRequest:
    """One sandbox a provider is asked to create."""

    source: str | None
    """A provider snapshot or template (what :meth:`Provider.make_snapshot` returns); None: the provider's base."""
    labels: Mapping[str, str]
    """The sandbox's metadata (the caller's labels and ``snapgym.owner``)."""
    idempotency_key: str
    """The same on every retry of one create, so a create whose answer was lost is not made twice."""
    internet: bool = False
    """Network from the start (a build's ``public`` policy); else none until a policy is set."""
    resources: Resources | None = None
    """What the sandbox needs: the provider sets what it can (:attr:`Provider.applied_resources`)."""
    image: ProviderImage | None = None
    """Start from this registry image (a template's build only; ``source`` is None then): its root
    filesystem, as the provider runs images. A provider that needs its own image or template made
    first (E2B's template build) makes it here, once per :attr:`ProviderImage.key`."""


class Provider(Protocol):
    """One cloud provider, through its SDK (see the module docstring)."""

    name: str
    """The backend's name (``e2b``, ``daytona``)."""

    applied_resources: frozenset[str]
    """Which of :class:`~pool.resources.Resources`' fields (``cpus``, ``memory_mb``, ``storage_mb``,
    ``gpus``) the provider sets on a sandbox of a template that starts from a registry image
    (:attr:`CreateRequest.image`); the others are reported as not applied, never silently dropped."""

    applied_on_base: frozenset[str]
    """The same, for a template built on the provider's base (its ``host`` base)."""

    def create(self, request: CreateRequest) -> Any:
        """A started sandbox as ``request`` describes it, with the backend's lifetime.

        Raises:
            ImageError: ``request.image`` cannot be pulled or built by the provider (the message says
                why and how to provide it).
        """

    def sandbox_id(self, remote: Any) -> str:
        """The provider's id of a sandbox."""

    def is_running(self, remote: Any) -> bool:
        """Whether the sandbox still answers."""

    def ended_from_inside(self, remote: Any) -> str | None:
        """If the sandbox has ended because its own processes ended it (its entrypoint exited, or the
        kernel killed it for its memory), how, as the provider reports it; else None: running, ended by
        the provider (its lifetime, a termination, a failure of its own), or not known."""

    def kill(self, remote: Any) -> None:
        """End a sandbox (one already gone counts as ended)."""

    def run(self, remote: Any, command: str, *, cwd: str, env: Mapping[str, str], timeout_s: float,
            cap: int) -> RawResult:  # fmt: skip
        """Run a shell line as root; at most ``cap`` bytes of each stream come back (and the client
        holds no more than that); ``timeout_s`` bounds the call (the line kills its own command first)."""

    def read(self, remote: Any, path: str) -> bytes:
        """An absolute path's bytes."""

    def write(self, remote: Any, path: str, data: bytes) -> None:
        """Write an absolute path, creating its parent folders."""

    def make_snapshot(self, remote: Any, name: str | None) -> str:
        """Freeze a sandbox into a snapshot (named ``name`` when given); what :meth:`create` takes."""

    def find_snapshot(self, prefix: str) -> tuple[str, str] | None:
        """(what :meth:`create` takes, the full name) of a snapshot whose name starts with ``prefix``."""

    def set_network(self, remote: Any, policy: NetworkPolicy) -> None:
        """Enforce ``policy`` on the sandbox's outbound traffic until changed."""

    def listed(self, labels: Mapping[str, str]) -> Iterator[Listed]:
        """Every live sandbox of the account that carries all of ``labels``."""

    def kill_id(self, sandbox_id: str) -> None:
        """End a sandbox by id (one already gone counts as ended)."""

    def close(self) -> None:
        """Release the SDK's clients."""
