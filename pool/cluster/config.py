"""Settings of a SandboxPool."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pool.errors import ConfigError
from pool.validation import require_positive

HOST_RESOURCE = "snapgym_host"
"""A node offers to host sandboxes by declaring this Ray resource (any amount)."""
SLOTS_RESOURCE = "snapgym_slots"
"""How many sandboxes a node may hold: ``ray start --resources='{"snapgym_host": 1, "snapgym_slots": 64}'``."""


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """How many sandboxes the pool keeps, and how it treats failures."""

    min_warm: int = 2
    """Ready sandboxes kept per snapshot even when idle."""
    max_warm: int = 32
    """The most ready sandboxes kept per snapshot when demand is high."""
    max_size: int = 256
    """The most sandboxes in the whole pool (ready, leased and restoring)."""
    host_capacity: int = 256
    """Sandboxes per host when its node does not declare ``snapgym_slots``."""
    lease_ttl_s: float = 30.0
    """A lease whose holder stops renewing it for this long is reclaimed and restored."""
    acquire_timeout_s: float = 60.0
    """How long acquire() waits for a ready sandbox by default."""
    idle_s: float = 10.0
    """After this long without a waiting acquire, the warm target shrinks toward ``min_warm`` (one step
    a second, giving back only ready sandboxes no acquire needed in that second)."""
    tick_s: float = 0.2
    """Period of the pool's maintenance (refill, reclaim, health)."""
    max_failures: int = 5
    """Failed sandboxes of one snapshot within ``failure_window_s`` that stop its recreation."""
    failure_window_s: float = 60.0
    max_host_restarts: int = 3
    """Host actors replaced on one node before the node is given up."""
    backend: str = "local"
    """The backend each host runs, by name (see ``pool.backends.BACKENDS``)."""
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    """Its options (its constructor's keyword arguments: memory_limit_mb, prewarm, ...)."""

    def __post_init__(self) -> None:
        if not 0 <= self.min_warm <= self.max_warm:
            raise ConfigError(f"need 0 <= min_warm <= max_warm, got {self.min_warm} and {self.max_warm}")
        if self.max_size < 1 or self.host_capacity < 1:
            raise ConfigError("max_size and host_capacity must be at least 1")
        require_positive(
            self, ("lease_ttl_s", "acquire_timeout_s", "idle_s", "tick_s", "failure_window_s"), what="pool setting"
        )
        if self.max_failures < 1 or self.max_host_restarts < 0:
            raise ConfigError("max_failures must be >= 1 and max_host_restarts >= 0")
