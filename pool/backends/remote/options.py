"""The options every cloud backend takes, declared once: :class:`RemoteOptions`.

A cloud backend's constructor takes its own options (credentials, endpoints,
its base) by name and these as ``**options``; :func:`with_remote_options` gives
the constructor the signature users see (its own options, then these, with the
defaults below), which is the schema :mod:`pool.backends` checks options
against. The runner's ``configs/backend/<cloud>.yaml`` take these keys and their
defaults from here too (``benchmarks.config.register_configs``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pool.build.registry.settings import RegistrySettings, registry_settings
from pool.errors import ConfigError
from pool.resources import DEFAULT_TIMEOUT_S

Init = TypeVar("Init", bound=Callable[..., None])
_ANONYMOUS = RegistrySettings()


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteOptions:
    """The options every cloud backend takes, with their one set of defaults."""

    sandbox_timeout_s: int = 3600
    """Each provider sandbox's lifetime at the provider: it ends then even if this process died without a
    word (Daytona rounds it up to minutes). An episode longer than it needs a larger one."""
    request_timeout_s: float = 60.0
    """How long one call to the provider may take (a create until the sandbox has started; an exec beyond
    the command's own timeout)."""
    default_timeout_s: float = DEFAULT_TIMEOUT_S
    """A command's timeout when ``exec`` is given none."""
    max_output_bytes: int = 1 << 20
    """A command's output cap per stream when ``exec`` is given none."""
    prewarm: bool = True
    """Keep a spare provider sandbox beside each sandbox, so that restore is a hand-off, not a cloud create."""
    max_workers: int = 8
    """Threads for background creates and kills."""
    max_creates_per_s: float | None = 5.0
    """Creations per second, on average, for every process on this machine (or Ray cluster) that uses the
    same account and endpoint (None: unpaced). Providers refuse bursts."""
    create_burst: int = 10
    """Creations allowed at once before the pace applies."""
    create_retries: int = 4
    """How often a create the provider refused for now (429, 5xx, RESOURCE_EXHAUSTED: after the SDK's own
    retries, if any) is tried again, with backoff and the same idempotency key."""
    rate_limit_file: str | None = None
    """Where the shared pace is kept (None: a file per account and endpoint under the user's runtime folder)."""
    registry: RegistrySettings | Mapping[str, Any] | None = _ANONYMOUS
    """How task images are read on the host and pulled by the provider, as the local backend's
    ``registry``: credentials (handed to the provider where it takes them), mirrors (the provider pulls
    from the first), plain-HTTP registries."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "registry", registry_settings(self.registry))
        if self.sandbox_timeout_s < 60:
            raise ConfigError(f"sandbox_timeout_s must be at least 60, got {self.sandbox_timeout_s}")
        if self.max_output_bytes < 1 or self.default_timeout_s <= 0 or self.create_retries < 0:
            raise ConfigError("max_output_bytes and default_timeout_s must be positive, create_retries >= 0")

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every option's name and default (what the runner's backend configs start from)."""
        return {field.name: field.default for field in dataclasses.fields(cls)}

    def bucket(self, backend: str, account: str) -> Path:
        """The shared pace's file: ``rate_limit_file``, else one per backend and (hashed) account."""
        if self.rate_limit_file:
            return Path(self.rate_limit_file)
        digest = hashlib.sha256(account.encode()).hexdigest()[:16]
        folder = Path(os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/snapgym-{os.getuid()}")
        return folder / "snapgym-ratelimit" / f"{backend}-{digest}.bucket"


def with_remote_options(init: Init) -> Init:
    """Give a cloud backend's ``__init__(self, *, own..., **options)`` the signature users see: its own
    keyword options, then :class:`RemoteOptions`' fields with their defaults (``**options`` is passed to
    :class:`RemoteOptions`, which refuses any other name)."""
    own = inspect.signature(init)
    parameters = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    parameters += [
        inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=field.default, annotation=field.type)
        for field in dataclasses.fields(RemoteOptions)
    ]
    init.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
    return init
