"""The Daytona backend: sandboxes are Daytona sandboxes, known-good states are Daytona snapshots.

What every cloud backend does alike (builds named by content hash, the start
digest, hand-offs, strict verification, pacing, reaping) is :mod:`pool.backends.remote`;
this module is Daytona's options and capabilities, :mod:`.provider` its SDK
calls. Builds start from ``base_snapshot`` (None: the organisation's default),
or from a task's registry image (Daytona builds it once; see :mod:`.images`),
and end in ``create_snapshot`` (files only: a sandbox from it starts with no
processes). Sandboxes are ephemeral with an idle stop and a hard TTL of
``sandbox_timeout_s``, so nothing outlives a runner killed with SIGKILL by more
than that. Daytona's SDK retries nothing, so 429 and 503 are retried here.
"""

from __future__ import annotations

import os
from typing import Any

import daytona

from pool.backends.daytona.provider import DaytonaProvider
from pool.backends.remote.backend import RemoteBackend, cloud_capabilities
from pool.backends.remote.credentials import Credentials
from pool.backends.remote.options import RemoteOptions, with_remote_options
from pool.capabilities import Capabilities, Enforcement

NAME = "daytona"


class DaytonaBackend(RemoteBackend):
    """Sandboxes on Daytona (https://daytona.io), or on a self-hosted Daytona, through the ``daytona`` SDK."""

    name = NAME
    credentials = Credentials(
        {"api_key": "DAYTONA_API_KEY"},
        missing="DAYTONA_API_KEY is not set: export it (https://app.daytona.io, Keys) or pass the backend "
        "option api_key; a self-hosted Daytona also needs api_url",
    )

    @with_remote_options
    def __init__(
        self,
        *,
        api_key: str | None = None,
        api_url: str | None = None,
        target: str | None = None,
        base_snapshot: str | None = None,
        **options: Any,
    ) -> None:
        """
        Args:
            api_key: the Daytona API key; default ``DAYTONA_API_KEY`` from the environment.
            api_url: the API's URL (default ``DAYTONA_API_URL``, else Daytona's cloud).
            target: the region (default ``DAYTONA_TARGET``, else the organisation's default).
            base_snapshot: the Daytona snapshot builds start from (snapgym's ``host`` base; None: the
                organisation's default snapshot).
            **options: the options every cloud backend takes (:class:`~pool.backends.remote.options.RemoteOptions`);
                ``sandbox_timeout_s`` is both the TTL and the idle stop, and ephemeral sandboxes are deleted
                when they stop.
        """
        key = self.credentials.resolve({"api_key": api_key})["api_key"]
        settings = RemoteOptions(**options)
        url = api_url or os.environ.get("DAYTONA_API_URL")
        config = daytona.DaytonaConfig(
            api_key=key, api_url=url, target=target or os.environ.get("DAYTONA_TARGET"), use_deprecated_polling=False
        )
        self.base_snapshot = base_snapshot
        provider = DaytonaProvider(
            config, base_snapshot=base_snapshot, lifetime_s=settings.sandbox_timeout_s,
            request_timeout_s=settings.request_timeout_s,
        )  # fmt: skip
        super().__init__(provider, settings, account=f"{key}|{url or 'daytona-cloud'}")

    @classmethod
    def declared_capabilities(cls) -> Capabilities:
        """The capabilities, stated without credentials or a connection (they do not depend on options)."""
        return cloud_capabilities(
            isolation=("container",), bases=("host", "image", "dockerfile"),
            limits={**dict.fromkeys(("memory", "cpu", "disk"), Enforcement.PROVIDER), "pids": Enforcement.NONE},
        )  # fmt: skip

    @property
    def base_identity(self) -> str:
        """The Daytona snapshot builds start from."""
        return self.base_snapshot or "default"
