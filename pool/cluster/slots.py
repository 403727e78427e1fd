"""The pool's bookkeeping: slots, their states, and the hosts that hold them."""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any


class SlotState(enum.Enum):
    """Where a pooled sandbox is in its cycle: READY → LEASED → RESTORING → READY.

    A slot whose restore or health check fails is FAILED: it is destroyed and
    a new sandbox takes its place.
    """

    READY = "ready"
    LEASED = "leased"
    RESTORING = "restoring"
    FAILED = "failed"


@dataclass(slots=True)
class HostRecord:
    """One host actor, as the pool knows it."""

    id: str
    node_id: str
    handle: Any
    capacity: int
    fastpath: str | None = None
    """The host's same-node socket (see pool.cluster.fastpath), when it has one."""
    fast: Any = None
    """A FastPathClient on that socket, when the pool runs on the host's node (else calls go through Ray)."""
    alive: bool = True
    slots: int = 0
    creating: int = 0

    @property
    def free(self) -> int:
        """Slots this host can still open."""
        return self.capacity - self.slots - self.creating


@dataclass(slots=True)
class Slot:
    """One pooled sandbox."""

    host: HostRecord
    number: int
    snapshot_id: str
    state: SlotState = SlotState.READY
    lease_id: str | None = None
    holder: str | None = None
    epoch: int = 0
    """Bumped each time the pool takes the slot back; leases carry the epoch they were granted in."""
    renewed_at: float = 0.0

    @property
    def key(self) -> tuple[str, int]:
        """Unique across the pool: (host id, slot number on that host)."""
        return (self.host.id, self.number)


@dataclass(slots=True)
class Served:
    """A snapshot the pool keeps warm sandboxes of."""

    snapshot: Any
    template: Any
    warm_target: int
    ready: deque[Slot] = field(default_factory=deque)
    creating: int = 0
    waiters: int = 0
    last_wait_at: float = 0.0
    last_grow_at: float = 0.0
    low_ready: int | None = None
    """The fewest ready slots any acquire left since the last shrink check (None: no acquire since):
    that many were never needed, the surplus the next check may give back."""
    pending_recreations: int = 0
    failure_times: deque[float] = field(default_factory=deque)
    last_error: str | None = None
    crash_looping: bool = False
