"""How the egress proxy's download cache is set: off, recording into a folder, or replaying from it."""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pool.errors import ConfigError
from pool.validation import choose

DEFAULT_MAX_BODY_BYTES = 2 << 30
"""The largest response body stored (2 GiB); a larger one is passed to the sandbox but not stored."""


class CacheMode(enum.Enum):
    """What the proxy does with the cache."""

    OFF = "off"
    """No cache: tunnels are relayed as they are (the default)."""
    RECORD = "record"
    """Every request is fetched from its origin, and the response stored."""
    REPLAY = "replay"
    """Requests are answered from the store only; the proxy connects nowhere."""


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """The ``egress.cache`` option: a response cache behind the proxy (see :mod:`pool.egress.cache`)."""

    mode: CacheMode = CacheMode.OFF
    """``off``, ``record`` or ``replay`` (:class:`CacheMode`, or its value)."""
    dir: str | None = None
    """The store's folder (index, blobs, the store's CA): required unless off. Every node of a
    run needs the same content here: a shared filesystem, or the same tar imported on each."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Responses with a larger body are passed through in ``record`` but not stored."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", _mode(self.mode))
        if self.dir is not None:
            object.__setattr__(self, "dir", os.path.abspath(os.path.expanduser(str(self.dir))))
        elif self.mode is not CacheMode.OFF:
            raise ConfigError(f"egress cache: mode {self.mode.value!r} needs a dir (the cache's folder)")
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes <= 0:
            raise ConfigError(f"egress cache: max_body_bytes must be a positive integer, got {self.max_body_bytes!r}")

    @property
    def is_on(self) -> bool:
        """Whether the proxy intercepts HTTP(S) (``record`` or ``replay``)."""
        return self.mode is not CacheMode.OFF

    @classmethod
    def parse(cls, value: CacheSettings | Mapping[str, Any] | str | None) -> CacheSettings:
        """Settings from a mapping of these fields, a mode alone, or None (off)."""
        if value is None:
            return cls()
        if isinstance(value, CacheSettings):
            return value
        if isinstance(value, str | bool):
            return cls(mode=_mode(value))
        if not isinstance(value, Mapping):
            raise ConfigError(f"egress cache must be a mapping (mode, dir, max_body_bytes), got {value!r}")
        unknown = set(value) - {"mode", "dir", "max_body_bytes"}
        if unknown:
            raise ConfigError(f"unknown egress cache setting(s) {sorted(unknown)}; known: dir, max_body_bytes, mode")
        return cls(**dict(value))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (what :meth:`parse` reads)."""
        return {"mode": self.mode.value, "dir": self.dir, "max_body_bytes": self.max_body_bytes}


def _mode(value: Any) -> CacheMode:
    if value is False or value is None:  # YAML 1.1 reads an unquoted `off` as false
        return CacheMode.OFF
    return choose(CacheMode, value, what="egress cache mode", fold_case=True)
