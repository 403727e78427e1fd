"""The E2B backend: sandboxes are E2B microVMs, known-good states are E2B snapshots.

What every cloud backend does alike (builds named by content hash, the start
digest, hand-offs, strict verification, pacing, reaping) is :mod:`pool.backends.remote`;
this module is E2B's options and capabilities, :mod:`.provider` its SDK calls.
Builds start from the E2B template ``base_template`` (it stands in for
snapgym's ``host`` base: E2B's "base" is a Debian userland with Python, git and
curl) and end in ``create_snapshot`` (memory and files).

The start digest. A remote sandbox's bytes cannot be hashed from here, so a
snapshot's identity has two parts: the provider's snapshot id (which pins the
whole filesystem and memory as E2B stored them) and a digest snapgym computes
*inside* the sandbox over the snapshot's working directory: every file's path,
content, mode and size and every link's target under it (not the rest of the
filesystem, and not ownership). It is computed when the snapshot is made and
again in every E2B sandbox before it is handed to an episode; a mismatch is a
SnapshotCorruptError. ``Snapshot.digest`` is a hash of both parts.

Lifetimes and leaks. Every E2B sandbox carries the sandbox's labels as
metadata (``snapgym.owner``: this backend; run/pool/attempt from the caller)
and a provider-side lifetime (``sandbox_timeout_s``), so a client killed with
SIGKILL leaves nothing running past it; ``reap_orphans`` kills what a run whose
process is gone left. Credentials come from ``E2B_API_KEY`` (or ``api_key``)
and never enter a sandbox.

Verification is strict only (:mod:`pool.backends.remote.verify`). Network policies map onto
E2B's egress filter (:mod:`pool.backends.e2b.network`), without an audit of the attempts.
Not yet (``Capabilities`` says so): resource limits (E2B fixes them per template),
image and Dockerfile bases other than ``FROM snapgym/host``.
"""

from __future__ import annotations

from typing import Any

from pool.backends.e2b.provider import E2BProvider
from pool.backends.remote.backend import RemoteBackend, cloud_capabilities
from pool.backends.remote.credentials import Credentials
from pool.backends.remote.options import RemoteOptions, with_remote_options
from pool.capabilities import Capabilities, Enforcement

NAME = "e2b"


class E2BBackend(RemoteBackend):
    """Sandboxes on E2B (https://e2b.dev), or on a self-hosted E2B, through the ``e2b`` SDK."""

    name = NAME
    credentials = Credentials(
        {"api_key": "E2B_API_KEY"},
        missing="E2B_API_KEY is not set: export it (https://e2b.dev/dashboard, API keys) or pass the backend "
        "option api_key; for a self-hosted E2B also set api_url/domain",
    )

    @with_remote_options
    def __init__(
        self,
        *,
        api_key: str | None = None,
        domain: str | None = None,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        base_template: str = "base",
        **options: Any,
    ) -> None:
        """
        Args:
            api_key: the E2B API key; default ``E2B_API_KEY`` from the environment.
            domain: E2B's domain (``E2B_DOMAIN``; default ``e2b.app``), for a self-hosted E2B.
            api_url: the control plane's URL, overriding ``domain`` (a stand-in server, a proxy).
            sandbox_url: where sandboxes' envd answers, overriding ``domain``.
            base_template: the E2B template that builds start from (snapgym's ``host`` base).
            **options: the options every cloud backend takes (:class:`~pool.backends.remote.options.RemoteOptions`).
        """
        key = self.credentials.resolve({"api_key": api_key})["api_key"]
        settings = RemoteOptions(**options)
        api: dict[str, Any] = {"api_key": key, "request_timeout": settings.request_timeout_s}
        for option, value in (("domain", domain), ("api_url", api_url), ("sandbox_url", sandbox_url)):
            if value is not None:
                api[option] = value
        self.base_template = base_template
        provider = E2BProvider(api, base_template=base_template, lifetime_s=settings.sandbox_timeout_s)
        super().__init__(provider, settings, account=f"{key}|{api_url or domain or 'e2b.app'}")

    @classmethod
    def declared_capabilities(cls) -> Capabilities:
        """The capabilities, stated without credentials or a connection (they do not depend on options)."""
        return cloud_capabilities(
            memory_snapshot=True, isolation=("microvm",), bases=("host", "image", "dockerfile"),
            limits={**dict.fromkeys(("memory", "cpu", "disk"), Enforcement.PROVIDER), "pids": Enforcement.NONE},
        )  # fmt: skip

    @property
    def base_identity(self) -> str:
        """The E2B template builds start from."""
        return self.base_template
