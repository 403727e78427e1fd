"""The pool's bookkeeping: slots, their states, the hosts that hold them, and what it counts.

:class:`SlotBook` holds every record of a running pool under one condition and
makes each move of a slot (leased, taken back, ready, failed, dropped), so the
manager, the demand policy (pool.cluster.demand) and the host supervisor
(pool.cluster.supervisor) all change the same books the same way.
"""

from __future__ import annotations

import enum
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pool.cluster.config import PoolConfig
from pool.errors import CrashLoopError, PoolClosedError, PoolError

_SAMPLES = 10_000


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
    """The host's same-node socket (see pool.cluster.calls.fastpath), when it has one."""
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


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """What acquire() hands to a Lease: where its sandbox lives.

    It names the host instead of carrying its actor handle: returning a handle
    from an actor costs Ray several milliseconds of reference bookkeeping, so
    clients fetch each host's handle once (``host_handle``) and cache it.
    """

    lease_id: str
    host_id: str
    slot: int
    epoch: int
    snapshot_id: str
    node_id: str
    ttl_s: float


def percentiles_ms(samples: deque[float] | list[float]) -> dict[str, float | int]:
    """p50/p90/p99 in milliseconds of samples in seconds, with their count."""
    if not samples:
        return {"n": 0}
    values = np.asarray(samples) * 1000.0
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"n": len(values), "p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(values.max())}


@dataclass(slots=True)
class PoolMetrics:
    """What the pool counts while it runs."""

    acquire_wait_s: deque[float] = field(default_factory=lambda: deque(maxlen=_SAMPLES))
    restore_s: deque[float] = field(default_factory=lambda: deque(maxlen=_SAMPLES))
    acquires: int = 0
    releases: int = 0
    failures: int = 0
    recreations: int = 0
    reclaimed_leases: int = 0
    lost_leases: int = 0
    host_failures: int = 0
    host_restarts: int = 0
    hosts_joined: int = 0
    remote_reaped: int = 0
    """Cloud sandboxes of dead hosts ended through a live host."""


class SlotBook:
    """Every host, slot, lease and served snapshot of a pool, under one condition (``cond``).

    Methods named ``*_locked`` expect the caller to hold ``cond``; the others need no lock.
    """

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.cond = threading.Condition()
        self.hosts: dict[str, HostRecord] = {}
        self.slots: dict[tuple[str, int], Slot] = {}
        self.leases: dict[str, Slot] = {}
        self.served: dict[str, Served] = {}
        self.metrics = PoolMetrics()
        self.closed = False

    def alive_hosts(self) -> list[HostRecord]:
        """The hosts not known to be dead."""
        return [h for h in self.hosts.values() if h.alive]

    def serving(self, snapshot_id: str) -> Served:
        """The served snapshot of that id.

        Raises:
            PoolError: the pool does not serve it.
        """
        served = self.served.get(snapshot_id)
        if served is None:
            raise PoolError(f"the pool does not serve snapshot {snapshot_id}; call pool.add(template) first")
        return served

    def check_usable(self, served: Served) -> None:
        """Raise PoolClosedError or CrashLoopError when no sandbox of ``served`` can be handed out."""
        if self.closed:
            raise PoolClosedError("the pool is closed; create a new SandboxPool")
        if served.crash_looping:
            raise CrashLoopError(
                f"sandboxes of snapshot {served.snapshot.id} failed {len(served.failure_times)} times within "
                f"{self.config.failure_window_s:.0f} s, so the pool stopped recreating them; "
                f"last error: {served.last_error}"
            )

    # -- moves of a slot -------------------------------------------------------

    def pop_ready_locked(self, served: Served) -> Slot | None:
        """The next READY slot of a live host, or None."""
        while served.ready:
            slot = served.ready.popleft()
            if slot.state is SlotState.READY and slot.host.alive and slot.key in self.slots:
                return slot
        return None

    def lease_locked(self, slot: Slot, served: Served, holder: str, waited_s: float) -> LeaseGrant:
        """Lease a READY slot to ``holder``."""
        lease_id = uuid.uuid4().hex
        slot.state = SlotState.LEASED
        slot.lease_id = lease_id
        slot.holder = holder
        slot.renewed_at = time.monotonic()
        self.leases[lease_id] = slot
        self.metrics.acquires += 1
        self.metrics.acquire_wait_s.append(waited_s)
        return LeaseGrant(lease_id, slot.host.id, slot.number, slot.epoch, served.snapshot.id, slot.host.node_id,
                          self.config.lease_ttl_s)  # fmt: skip

    def take_back_locked(self, slot: Slot) -> None:
        """A slot leaves its lease and is RESTORING, in a new epoch."""
        slot.state = SlotState.RESTORING
        slot.lease_id = None
        slot.holder = None
        slot.epoch += 1

    def expired_locked(self, now: float) -> list[Slot]:
        """Remove the leases whose holder stopped renewing them; returns their slots."""
        expired = []
        for lease_id, slot in list(self.leases.items()):
            if now - slot.renewed_at > self.config.lease_ttl_s:
                del self.leases[lease_id]
                self.metrics.reclaimed_leases += 1
                expired.append(slot)
        return expired

    def ready_locked(self, slot: Slot, restore_s: float) -> None:
        """A restored slot is READY again."""
        slot.state = SlotState.READY
        self.metrics.restore_s.append(restore_s)
        self.served[slot.snapshot_id].ready.append(slot)
        self.cond.notify_all()

    def opened_locked(self, host: HostRecord, served: Served, numbers: list[int], error: str | None) -> None:
        """New READY slots a host opened (``error``: why it opened fewer than asked)."""
        for number in numbers:
            slot = Slot(host, number, served.snapshot.id)
            self.slots[slot.key] = slot
            host.slots += 1
            served.ready.append(slot)
        recreated = min(served.pending_recreations, len(numbers))
        served.pending_recreations -= recreated
        self.metrics.recreations += recreated
        if error is not None:
            self.metrics.failures += 1
            self.record_failure_locked(served, error)
        self.cond.notify_all()

    def fail_slot_locked(self, slot: Slot, error: str) -> None:
        """A slot's sandbox broke: destroy it, and recreate it unless its snapshot crash-loops."""
        slot.state = SlotState.FAILED
        self.drop_slot_locked(slot)
        self.metrics.failures += 1
        served = self.served[slot.snapshot_id]
        if slot.host.alive:
            slot.host.handle.destroy.remote(slot.number)
        if not self.record_failure_locked(served, error):
            served.pending_recreations += 1
        self.cond.notify_all()

    def record_failure_locked(self, served: Served, error: str) -> bool:
        """Count a failure in the window; returns whether the snapshot is now crash-looping."""
        served.last_error = error
        now = time.monotonic()
        served.failure_times.append(now)
        while served.failure_times and now - served.failure_times[0] > self.config.failure_window_s:
            served.failure_times.popleft()
        if len(served.failure_times) >= self.config.max_failures:
            served.crash_looping = True
        return served.crash_looping

    def drop_slot_locked(self, slot: Slot) -> None:
        """Forget a slot (its lease too); the caller ends its sandbox."""
        if self.slots.pop(slot.key, None) is not None:
            slot.host.slots -= 1
        if slot.lease_id is not None:
            self.leases.pop(slot.lease_id, None)
        served = self.served.get(slot.snapshot_id)
        if served is not None and slot in served.ready:
            served.ready.remove(slot)

    def give_back_locked(self, served: Served, n: int) -> None:
        """Destroy the ``n`` most recently readied slots of a snapshot."""
        for _ in range(n):
            slot = served.ready.pop()
            self.drop_slot_locked(slot)
            if slot.host.alive:
                slot.host.handle.destroy.remote(slot.number)

    def host_died_locked(self, host: HostRecord) -> bool:
        """Mark a host dead and drop its slots (each to be recreated); False when it was already."""
        if not host.alive:
            return False
        host.alive = False
        self.metrics.host_failures += 1
        for slot in [s for s in self.slots.values() if s.host is host]:
            if slot.lease_id is not None:
                self.metrics.lost_leases += 1
            self.drop_slot_locked(slot)
            self.served[slot.snapshot_id].pending_recreations += 1
        self.cond.notify_all()
        return True

    # -- counts ----------------------------------------------------------------

    def restoring_locked(self, served: Served) -> int:
        """Slots of a snapshot being restored."""
        sid = served.snapshot.id
        return sum(1 for s in self.slots.values() if s.snapshot_id == sid and s.state is SlotState.RESTORING)

    def room_locked(self) -> int:
        """Sandboxes the pool may still open under ``max_size``."""
        return self.config.max_size - len(self.slots) - sum(s.creating for s in self.served.values())

    def health_locked(self) -> str | None:
        """None when the pool can serve (open, with a live host); otherwise why not."""
        if self.closed:
            return "the pool is closed"
        if not self.alive_hosts():
            lost = ", ".join(sorted({h.node_id[:8] for h in self.hosts.values()}))
            return f"no live sandbox host (the hosts on node(s) {lost} died and none has replaced them yet)"
        return None

    def stats_locked(self) -> dict[str, Any]:
        """Slot counts by state, latency percentiles, failures, hosts, and per-snapshot targets."""
        states = Counter(slot.state.value for slot in self.slots.values())
        m = self.metrics
        return {
            "slots": {state.value: states.get(state.value, 0) for state in SlotState},
            "creating": sum(s.creating for s in self.served.values()),
            "acquire_wait_ms": percentiles_ms(m.acquire_wait_s),
            "restore_ms": percentiles_ms(m.restore_s),
            "acquires": m.acquires,
            "releases": m.releases,
            "failures": m.failures,
            "recreations": m.recreations,
            "reclaimed_leases": m.reclaimed_leases,
            "lost_leases": m.lost_leases,
            "host_failures": m.host_failures,
            "host_restarts": m.host_restarts,
            "hosts_joined": m.hosts_joined,
            "remote_reaped": m.remote_reaped,
            "hosts": [
                {"id": h.id, "node_id": h.node_id, "alive": h.alive, "slots": h.slots, "capacity": h.capacity}
                for h in self.hosts.values()
            ],
            "snapshots": {sid: self.snapshot_stats_locked(s) for sid, s in self.served.items()},
        }

    def summary_locked(self, served: Served) -> str:
        """A served snapshot's counts in one line, for errors."""
        stats = self.snapshot_stats_locked(served)
        return ", ".join(f"{k}={v}" for k, v in stats.items() if k != "last_error")

    def snapshot_stats_locked(self, served: Served) -> dict[str, Any]:
        """A served snapshot's warm target and slot counts."""
        mine = [s for s in self.slots.values() if s.snapshot_id == served.snapshot.id]
        return {
            "warm_target": served.warm_target,
            "ready": sum(1 for s in mine if s.state is SlotState.READY),
            "leased": sum(1 for s in mine if s.state is SlotState.LEASED),
            "restoring": sum(1 for s in mine if s.state is SlotState.RESTORING),
            "creating": served.creating,
            "crash_looping": served.crash_looping,
            "last_error": served.last_error,
        }
