"""The Daytona backend: sandboxes are Daytona sandboxes, known-good states are Daytona snapshots.

What every cloud backend does alike (builds named by content hash, the start
digest, hand-offs, strict verification, pacing, reaping) is :mod:`pool.backends.remote`;
this module is Daytona's options and capabilities, :mod:`.provider` its SDK
calls. Builds start from ``base_snapshot`` (None: the organisation's default)
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
from pool.backends.remote.backend import RemoteBackend, RemoteSettings, cloud_capabilities
from pool.capabilities import Capabilities
from pool.errors import ConfigError

NAME = "daytona"
_MISSING_KEY = (
    "DAYTONA_API_KEY is not set: export it (https://app.daytona.io, Keys) or pass the backend option api_key; "
    "a self-hosted Daytona also needs api_url"
)


class DaytonaBackend(RemoteBackend):
    """Sandboxes on Daytona (https://daytona.io), or on a self-hosted Daytona, through the ``daytona`` SDK."""

    name = NAME

    def __init__(
        self,
        *,
        api_key: str | None = None,
        api_url: str | None = None,
        target: str | None = None,
        base_snapshot: str | None = None,
        sandbox_timeout_s: int = 3600,
        request_timeout_s: float = 60.0,
        default_timeout_s: float = 600.0,
        max_output_bytes: int = 1 << 20,
        prewarm: bool = True,
        max_workers: int = 8,
        max_creates_per_s: float | None = 5.0,
        create_burst: int = 10,
        create_retries: int = 4,
        rate_limit_file: str | None = None,
    ) -> None:
        """
        Args:
            api_key: the Daytona API key; default ``DAYTONA_API_KEY`` from the environment.
            api_url: the API's URL (default ``DAYTONA_API_URL``, else Daytona's cloud).
            target: the region (default ``DAYTONA_TARGET``, else the organisation's default).
            base_snapshot: the Daytona snapshot builds start from (snapgym's ``host`` base; None: the
                organisation's default snapshot).
            sandbox_timeout_s: each sandbox's hard lifetime (TTL) and idle stop at Daytona, rounded up to
                minutes; ephemeral sandboxes are deleted when they stop.
            request_timeout_s: how long a create (until the sandbox has started) or an API call may take.
            default_timeout_s: a command's timeout when ``exec`` is given none.
            max_output_bytes: a command's output cap per stream when ``exec`` is given none.
            prewarm: keep a spare sandbox per sandbox, so that restore is a hand-off.
            max_workers: threads for background creates and deletes.
            max_creates_per_s: sandbox creations per second, on average, for every process on this
                machine that uses the same account and endpoint (None: unpaced).
            create_burst: creations allowed at once before the pace applies.
            create_retries: how often a create Daytona refused for now (429, 5xx) is tried again.
            rate_limit_file: where the shared pace is kept (default: a file per account and endpoint).
        """
        key = api_key or os.environ.get("DAYTONA_API_KEY")
        if not key:
            raise ConfigError(_MISSING_KEY)
        settings = RemoteSettings(
            sandbox_timeout_s, request_timeout_s, default_timeout_s, max_output_bytes, prewarm, max_workers,
            max_creates_per_s, create_burst, create_retries, rate_limit_file,
        )  # fmt: skip
        url = api_url or os.environ.get("DAYTONA_API_URL")
        config = daytona.DaytonaConfig(
            api_key=key, api_url=url, target=target or os.environ.get("DAYTONA_TARGET"), use_deprecated_polling=False
        )
        self.base_snapshot = base_snapshot
        provider = DaytonaProvider(
            config, base_snapshot=base_snapshot, lifetime_s=sandbox_timeout_s, request_timeout_s=request_timeout_s
        )
        super().__init__(provider, settings, account=f"{key}|{url or 'daytona-cloud'}")

    @classmethod
    def unavailable_reason(cls, **options: Any) -> str | None:
        """Why this backend cannot run here (no API key), or None."""
        if not (options.get("api_key") or os.environ.get("DAYTONA_API_KEY")):
            return _MISSING_KEY
        return None

    @classmethod
    def declared_capabilities(cls) -> Capabilities:
        """The capabilities, stated without credentials or a connection (they do not depend on options)."""
        return cloud_capabilities(isolation=("container",))

    @property
    def base_identity(self) -> str:
        """The Daytona snapshot builds start from."""
        return self.base_snapshot or "default"
