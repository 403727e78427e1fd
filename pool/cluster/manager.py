"""The pool's brain, run as one Ray actor: slots, leases, refills, failures.

It keeps, for each snapshot it serves, ``warm_target`` READY sandboxes beside
the ones in use, spread over host actors (one per node). ``acquire`` hands out
a READY slot at once when there is one; ``release`` starts the slot's restore
in the background and the slot is READY again when the host reports success.
A maintenance thread refills, shrinks idle targets, reclaims leases whose
holder stopped renewing them, and replaces host actors that died. Every
restore or creation failure is counted; too many in a window stop the
recreation of that snapshot's sandboxes (a crash loop) with the last error.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pool.capabilities import Capabilities
from pool.cluster import raycalls
from pool.cluster.config import HOST_RESOURCE, SLOTS_RESOURCE, PoolConfig
from pool.cluster.fastpath import FastPathClient, FastPathServer, reachable
from pool.cluster.host import BackendFactory, RestoreReport, host_actor_class
from pool.cluster.metrics import PoolMetrics, percentiles_ms
from pool.cluster.orphans import exit_when_orphaned
from pool.cluster.slots import HostRecord, Served, Slot, SlotState
from pool.errors import (
    AcquireTimeoutError,
    CrashLoopError,
    HostBrokenError,
    PoolClosedError,
    PoolError,
    SnapgymError,
    SnapshotError,
)
from pool.labels import HOST, POOL
from pool.snapshots import Snapshot
from pool.templates import Template

_OPEN_CHUNK = 16
_RECYCLERS = 32
_PING_EVERY_S = 1.0
_PING_TIMEOUT_S = 30.0
_NODE_SCAN_EVERY_S = 5.0
"""How often the pool looks for hosting nodes that joined the cluster."""


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


class PoolManager:
    """Slot bookkeeping for a SandboxPool (runs inside a threaded Ray actor)."""

    def __init__(self, config: PoolConfig, backend_factory: BackendFactory) -> None:
        self.config = config
        self._factory = backend_factory
        self._cond = threading.Condition()
        self._hosts: dict[str, HostRecord] = {}
        self._slots: dict[tuple[str, int], Slot] = {}
        self._leases: dict[str, Slot] = {}
        self._served: dict[str, Served] = {}
        self._node_restarts: Counter[str] = Counter()
        self._adopting: set[str] = set()
        self._refused_nodes: set[str] = set()
        self._metrics = PoolMetrics()
        self._closed = False
        # Ray runs future callbacks on its own threads, where calling Ray again can deadlock;
        # the callbacks only hand their results to this thread.
        self._events = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapgym-pool-events")
        # Restores on this node's hosts go through their fast path (a Ray call costs the manager
        # and the host about 2 ms of CPU each, once per episode); each waits on one of these threads.
        self._recyclers = ThreadPoolExecutor(max_workers=_RECYCLERS, thread_name_prefix="snapgym-pool-recycle")
        self._host_class = host_actor_class()
        self.pool_id = f"pool-{uuid.uuid4().hex[:12]}"
        """Every sandbox of the pool carries it as its ``snapgym.pool`` label."""
        self._snapshots_shared: bool | None = None
        """Whether the backend's snapshots live where every node reaches them (read from its capabilities)."""
        exit_when_orphaned()
        for node_id, capacity in _hosting_nodes(config):
            self._start_host(node_id, capacity)
        if not self._hosts:
            raise PoolError("no Ray node can host sandboxes; start one with resources {'snapgym_host': 1}")
        self._fastpath = FastPathServer(self, frozenset({"acquire", "release", "renew", "report_host_failure"}))
        threading.Thread(target=self._maintain, name="snapgym-pool", daemon=True).start()
        threading.Thread(target=self._watch_hosts, name="snapgym-pool-health", daemon=True).start()

    # -- the API a SandboxPool calls ------------------------------------------

    def add(self, template: Template) -> Snapshot:
        """Build a template on every host and keep warm sandboxes of it."""
        hosts = self._alive_hosts()
        import ray

        if self._shared_snapshots(hosts[0]):  # built once, where every node reaches it
            snapshot = ray.get(hosts[0].handle.build.remote(template))
            ray.get([h.handle.adopt.remote(snapshot) for h in hosts[1:]])
            return self._serve(snapshot, template)
        snapshots: list[Snapshot] = ray.get([h.handle.build.remote(template) for h in hosts])
        digests = {s.digest for s in snapshots}
        if len(digests) > 1:
            raise SnapshotError(
                f"template {template.name!r} built to {len(digests)} different digests on {len(hosts)} nodes: "
                "their host userlands differ; give the template a root filesystem base"
            )
        return self._serve(snapshots[0], template)

    def _serve(self, snapshot: Snapshot, template: Template) -> Snapshot:
        with self._cond:
            if snapshot.id not in self._served:
                self._served[snapshot.id] = Served(snapshot, template, warm_target=self.config.min_warm)
            self._refill_locked(self._served[snapshot.id])
        return snapshot

    def _shared_snapshots(self, host: HostRecord) -> bool:
        """``Capabilities.snapshot_location == "remote"``, asked of a host once."""
        import ray

        if self._snapshots_shared is None:
            capabilities = ray.get(host.handle.capabilities.remote(), timeout=120)
            self._snapshots_shared = capabilities.snapshot_location == "remote"
        return self._snapshots_shared

    def acquire(self, snapshot_id: str, timeout_s: float | None, holder: str) -> LeaseGrant:
        """A READY slot, leased to ``holder``; waits up to ``timeout_s`` for one."""
        started = time.monotonic()
        deadline = started + (timeout_s if timeout_s is not None else self.config.acquire_timeout_s)
        with self._cond:
            served = self._serving(snapshot_id)
            while True:
                self._check_usable(served)
                slot = self._pop_ready_locked(served)
                if slot is not None:
                    return self._lease_locked(slot, served, holder, time.monotonic() - started)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AcquireTimeoutError(
                        f"no sandbox of snapshot {snapshot_id} became ready in {deadline - started:.1f} s "
                        f"({self._summary_locked(served)}); raise max_size or the acquire timeout"
                    )
                served.waiters += 1
                served.last_wait_at = time.monotonic()
                self._grow_locked(served)
                self._refill_locked(served)
                self._cond.wait(min(remaining, self.config.tick_s))
                served.waiters -= 1

    def release(self, lease_id: str, failed: str | None = None) -> None:
        """Take a slot back and restore it in the background; ``failed`` says the sandbox broke."""
        with self._cond:
            slot = self._leases.pop(lease_id, None)
            if slot is None or slot.key not in self._slots:
                return
            self._metrics.releases += 1
            if failed is not None:
                slot.lease_id = None
                self._fail_slot_locked(slot, failed)
            else:
                self._restore_locked(slot)

    def renew(self, lease_ids: list[str]) -> list[str]:
        """Mark leases as still held; returns the ones the pool no longer has."""
        now = time.monotonic()
        lost = []
        with self._cond:
            for lease_id in lease_ids:
                slot = self._leases.get(lease_id)
                if slot is None:
                    lost.append(lease_id)
                else:
                    slot.renewed_at = now
        return lost

    def report_host_failure(self, host_id: str) -> None:
        """A lease found its host gone: check it now, so no acquire is handed its dead sandboxes."""
        import ray

        host = self._hosts.get(host_id)
        if host is None or not host.alive:
            return
        try:
            ray.get(host.handle.ping.remote(), timeout=5)
        except Exception:
            self._host_died(host)

    def stats(self) -> dict[str, Any]:
        """Slot counts by state, latency percentiles, failures, hosts, and per-snapshot targets."""
        with self._cond:
            states = Counter(slot.state.value for slot in self._slots.values())
            m = self._metrics
            return {
                "slots": {state.value: states.get(state.value, 0) for state in SlotState},
                "creating": sum(s.creating for s in self._served.values()),
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
                    for h in self._hosts.values()
                ],
                "snapshots": {sid: self._snapshot_stats_locked(s) for sid, s in self._served.items()},
            }

    def machine_memory(self) -> dict[str, int]:
        """Bytes in use on each machine that hosts sandboxes (machine id -> MemTotal - MemAvailable)."""
        import ray

        reports = ray.get([h.handle.machine_memory.remote() for h in self._alive_hosts()], timeout=60)
        return dict(reports)

    def wait_ready(self, snapshot_id: str, n: int, timeout_s: float) -> int:
        """Wait until ``n`` sandboxes of a snapshot are READY (for warm-up); returns how many are."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            served = self._serving(snapshot_id)
            served.warm_target = max(served.warm_target, min(n, self.config.max_size))
            served.last_wait_at = served.last_grow_at = time.monotonic()  # demand: no shrinking for idle_s
            while len(served.ready) < n and time.monotonic() < deadline and not served.crash_looping:
                self._refill_locked(served)
                self._cond.wait(min(self.config.tick_s, max(deadline - time.monotonic(), 0.0)))
            return len(served.ready)

    def close(self) -> None:
        """Destroy every sandbox and host actor."""
        import ray

        with self._cond:
            self._closed = True
            hosts = list(self._hosts.values())
            self._cond.notify_all()
        closing = [h.handle.close.remote() for h in hosts if h.alive]
        ray.wait(closing, num_returns=len(closing), timeout=60)
        self._fastpath.close()
        self._events.shutdown(wait=False, cancel_futures=True)
        self._recyclers.shutdown(wait=False, cancel_futures=True)
        for host in hosts:
            ray.kill(host.handle, no_restart=True)

    def ping(self) -> bool:
        """The manager is up."""
        return True

    def health(self) -> str | None:
        """None when the pool can serve (open, with a live host); otherwise why not."""
        with self._cond:
            if self._closed:
                return "the pool is closed"
            if not self._alive_hosts():
                lost = ", ".join(sorted({h.node_id[:8] for h in self._hosts.values()}))
                return f"no live sandbox host (the hosts on node(s) {lost} died and none has replaced them yet)"
        return None

    def capabilities(self) -> Capabilities:
        """The capabilities of the hosts' backend (every host runs the same backend and options)."""
        import ray

        hosts = self._alive_hosts()
        if not hosts:
            raise PoolError(self.health() or "no live sandbox host")
        capabilities: Capabilities = ray.get(hosts[0].handle.capabilities.remote(), timeout=120)
        return capabilities

    def host_info(self, host_id: str) -> tuple[Any, str | None]:
        """The actor handle and fast-path socket of a host, for clients to cache."""
        with self._cond:
            host = self._hosts[host_id]
            return host.handle, host.fastpath

    def fastpath(self) -> str:
        """The manager's fast-path socket, for clients on its node."""
        return self._fastpath.path

    def snapshot(self, snapshot_id: str) -> Snapshot:
        """A served snapshot by id."""
        with self._cond:
            snapshot: Snapshot = self._serving(snapshot_id).snapshot
            return snapshot

    # -- slots ----------------------------------------------------------------

    def _lease_locked(self, slot: Slot, served: Served, holder: str, waited_s: float) -> LeaseGrant:
        lease_id = uuid.uuid4().hex
        slot.state = SlotState.LEASED
        slot.lease_id = lease_id
        slot.holder = holder
        slot.renewed_at = time.monotonic()
        self._leases[lease_id] = slot
        self._metrics.acquires += 1
        self._metrics.acquire_wait_s.append(waited_s)
        left = len(served.ready)
        served.low_ready = left if served.low_ready is None else min(served.low_ready, left)
        self._refill_locked(served)
        return LeaseGrant(lease_id, slot.host.id, slot.number, slot.epoch, served.snapshot.id, slot.host.node_id,
                          self.config.lease_ttl_s)  # fmt: skip

    def _pop_ready_locked(self, served: Served) -> Slot | None:
        while served.ready:
            slot = served.ready.popleft()
            if slot.state is SlotState.READY and slot.host.alive and slot.key in self._slots:
                return slot
        return None

    def _restore_locked(self, slot: Slot) -> None:
        slot.state = SlotState.RESTORING
        slot.lease_id = None
        slot.holder = None
        slot.epoch += 1
        host = slot.host
        if host.fast is not None:
            future = self._recyclers.submit(host.fast.call, "recycle", slot.number, slot.snapshot_id, slot.epoch)
        else:
            future = host.handle.recycle.remote(slot.number, slot.snapshot_id, slot.epoch).future()
        future.add_done_callback(lambda done: self._events.submit(self._restored, slot, done))

    def _restored(self, slot: Slot, done: Any) -> None:
        report: RestoreReport | None = None
        try:
            report = done.result()
            error = report.error if report else None
            host_broken = bool(report and report.host_broken)
        except Exception as exc:
            error, host_broken = _describe(exc), _is_host_failure(exc)
        if host_broken:
            self._host_died(slot.host)
            return
        with self._cond:
            if slot.key not in self._slots or self._closed:
                return
            if report is not None and report.ok:
                slot.state = SlotState.READY
                self._metrics.restore_s.append(report.duration_s)
                self._served[slot.snapshot_id].ready.append(slot)
                self._cond.notify_all()
            else:
                self._fail_slot_locked(slot, error or "restore failed")

    def _fail_slot_locked(self, slot: Slot, error: str) -> None:
        slot.state = SlotState.FAILED
        self._drop_slot_locked(slot)
        self._metrics.failures += 1
        served = self._served[slot.snapshot_id]
        if slot.host.alive:
            slot.host.handle.destroy.remote(slot.number)
        if not self._record_failure_locked(served, error):
            served.pending_recreations += 1
        self._cond.notify_all()

    def _record_failure_locked(self, served: Served, error: str) -> bool:
        """Count a failure in the window; returns whether the snapshot is now crash-looping."""
        served.last_error = error
        now = time.monotonic()
        served.failure_times.append(now)
        while served.failure_times and now - served.failure_times[0] > self.config.failure_window_s:
            served.failure_times.popleft()
        if len(served.failure_times) >= self.config.max_failures:
            served.crash_looping = True
        return served.crash_looping

    def _drop_slot_locked(self, slot: Slot) -> None:
        if self._slots.pop(slot.key, None) is not None:
            slot.host.slots -= 1
        if slot.lease_id is not None:
            self._leases.pop(slot.lease_id, None)
        served = self._served.get(slot.snapshot_id)
        if served is not None and slot in served.ready:
            served.ready.remove(slot)

    # -- filling and shrinking ------------------------------------------------

    def _refill_locked(self, served: Served) -> None:
        if served.crash_looping or self._closed:
            return
        # A slot being restored is ready in milliseconds: it counts toward the warm target, or every
        # release under steady load would open a sandbox that the next shrink check destroys again.
        restoring = sum(
            1 for s in self._slots.values() if s.snapshot_id == served.snapshot.id and s.state is SlotState.RESTORING
        )
        room = self.config.max_size - len(self._slots) - sum(s.creating for s in self._served.values())
        deficit = min(served.warm_target - len(served.ready) - served.creating - restoring, room)
        while deficit > 0:
            host = max(self._alive_hosts(), key=lambda h: h.free, default=None)
            if host is None or host.free <= 0:
                return
            n = min(deficit, host.free, _OPEN_CHUNK)
            host.creating += n
            served.creating += n
            future = host.handle.open.remote(served.snapshot.id, n).future()
            future.add_done_callback(
                lambda done, h=host, s=served, k=n: self._events.submit(self._opened, h, s, k, done)
            )
            deficit -= n

    def _opened(self, host: HostRecord, served: Served, asked: int, done: Any) -> None:
        host_broken = False
        try:
            numbers: list[int] = done.result()
            error = None
        except Exception as exc:
            numbers, error, host_broken = [], _describe(exc), _is_host_failure(exc)
        if host_broken:
            with self._cond:
                host.creating -= asked
                served.creating -= asked
            self._host_died(host)
            return
        with self._cond:
            host.creating -= asked
            served.creating -= asked
            if self._closed:
                return
            for number in numbers:
                slot = Slot(host, number, served.snapshot.id)
                self._slots[slot.key] = slot
                host.slots += 1
                served.ready.append(slot)
            recreated = min(served.pending_recreations, len(numbers))
            served.pending_recreations -= recreated
            self._metrics.recreations += recreated
            if error is not None:
                self._metrics.failures += 1
                self._record_failure_locked(served, error)
            self._cond.notify_all()

    def _grow_locked(self, served: Served) -> None:
        now = time.monotonic()
        if now - served.last_grow_at >= self.config.tick_s:
            served.warm_target = min(self.config.max_warm, max(served.warm_target * 2, served.waiters, 1))
            served.last_grow_at = now

    def _shrink_locked(self, served: Served, now: float) -> None:
        """Once no acquire has waited for ``idle_s``, each second: lower the warm target by one and
        destroy the ready slots that went unused since the last check (never one an acquire needed)."""
        if now - served.last_wait_at < self.config.idle_s or now - served.last_grow_at < 1.0:
            return
        surplus = len(served.ready) if served.low_ready is None else served.low_ready
        served.low_ready = None
        served.last_grow_at = now
        if surplus <= 0:  # an acquire took the last ready slot: every one of them is in use
            return
        if served.warm_target > self.config.min_warm:
            served.warm_target -= 1
        for _ in range(min(surplus, len(served.ready) - served.warm_target)):
            slot = served.ready.pop()
            self._drop_slot_locked(slot)
            if slot.host.alive:
                slot.host.handle.destroy.remote(slot.number)

    # -- maintenance ----------------------------------------------------------

    def _maintain(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                self._reclaim_expired_locked(now)
                for served in self._served.values():
                    self._shrink_locked(served, now)
                    self._refill_locked(served)
                self._cond.wait(self.config.tick_s)

    def _watch_hosts(self) -> None:
        """Ping every host each second (one that fails or hangs is replaced), and look for new nodes."""
        last_scan = time.monotonic()
        while not self._closed:
            time.sleep(_PING_EVERY_S)
            self._check_hosts()
            if time.monotonic() - last_scan >= _NODE_SCAN_EVERY_S:
                last_scan = time.monotonic()
                with contextlib.suppress(Exception):  # the GCS may be briefly unreachable
                    self._adopt_new_nodes()

    def _reclaim_expired_locked(self, now: float) -> None:
        for lease_id, slot in list(self._leases.items()):
            if now - slot.renewed_at > self.config.lease_ttl_s:
                del self._leases[lease_id]
                self._metrics.reclaimed_leases += 1
                self._restore_locked(slot)

    def _check_hosts(self) -> None:
        import ray

        hosts = self._alive_hosts()
        pings = {h.handle.ping.remote(): h for h in hosts}
        ready, hung = ray.wait(list(pings), num_returns=len(pings), timeout=_PING_TIMEOUT_S)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:
                self._host_died(pings[ref])
        for ref in hung:
            self._host_died(pings[ref])

    def _host_died(self, host: HostRecord) -> None:
        import ray

        with self._cond:
            if not host.alive:
                return
            host.alive = False
            self._metrics.host_failures += 1
            for slot in [s for s in self._slots.values() if s.host is host]:
                if slot.lease_id is not None:
                    self._metrics.lost_leases += 1
                self._drop_slot_locked(slot)
                self._served[slot.snapshot_id].pending_recreations += 1
            self._cond.notify_all()
        with contextlib.suppress(Exception):  # broken or hung: make sure it is gone with its sandboxes
            ray.kill(host.handle, no_restart=True)
        if self._snapshots_shared:  # a cloud backend: the dead host's sandboxes live on at the provider
            threading.Thread(target=self._reap_remote, args=(host,), daemon=True).start()
        threading.Thread(target=self._replace_host, args=(host,), daemon=True).start()

    def _reap_remote(self, dead: HostRecord) -> None:
        """End a dead host's provider sandboxes through a live host (each carries the pool and host
        labels), waiting for the replacement when no other host lives; the provider's lifetime ends
        them anyway if none comes."""
        import ray

        labels = {POOL: self.pool_id, HOST: dead.id}
        deadline = time.monotonic() + _REAP_WAIT_S
        while time.monotonic() < deadline and not self._closed:
            for host in self._alive_hosts():
                try:
                    reaped = ray.get(host.handle.reap_labelled.remote(labels), timeout=120)
                except Exception:
                    continue
                with self._cond:
                    self._metrics.remote_reaped += int(reaped)
                return
            time.sleep(0.5)

    def _replace_host(self, dead: HostRecord) -> None:
        if self._node_restarts[dead.node_id] >= self.config.max_host_restarts:
            return
        if dead.node_id not in {node_id for node_id, _ in _hosting_nodes(self.config)}:
            return
        self._node_restarts[dead.node_id] += 1
        with self._cond:
            templates = tuple(s.template for s in self._served.values())
        try:
            self._start_host(dead.node_id, dead.capacity, templates)
        except Exception:
            return
        with self._cond:
            self._metrics.host_restarts += 1

    def _start_host(self, node_id: str, capacity: int, templates: tuple[Template, ...] = ()) -> HostRecord:
        """Start a host actor on a node, build the served templates there, then register it.

        Registering only after the builds means no refill opens a sandbox of a snapshot the
        host does not have yet.

        Raises:
            SnapshotError: a template built to another digest on this node (its userland differs).
        """
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        host_id = uuid.uuid4().hex[:12]
        handle = self._host_class.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
        ).remote(self._factory, capacity=capacity, labels={POOL: self.pool_id, HOST: host_id})
        info = ray.get(handle.ping.remote(), timeout=120)
        if templates and self._snapshots_shared:
            with self._cond:
                snapshots = [s.snapshot for s in self._served.values()]
            ray.get([handle.adopt.remote(snapshot) for snapshot in snapshots], timeout=120)
        elif templates:
            built: list[Snapshot] = ray.get([handle.build.remote(t) for t in templates], timeout=600)
            with self._cond:
                expected = {s.snapshot.id: s.snapshot.digest for s in self._served.values()}
            foreign = [b for b in built if b.id in expected and expected[b.id] != b.digest]
            if foreign:
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)
                raise SnapshotError(
                    f"node {node_id[:8]} built {foreign[0].id} to another digest: its host userland differs"
                )
        fastpath = info.get("fastpath")
        fast = FastPathClient(fastpath) if reachable(fastpath) else None
        record = HostRecord(host_id, node_id, handle, capacity, fastpath=fastpath, fast=fast)
        with self._cond:
            self._hosts[record.id] = record
            for served in self._served.values():
                self._refill_locked(served)
        return record

    def _adopt_new_nodes(self) -> None:
        """Start hosts on hosting nodes that joined the cluster after the pool started."""
        with self._cond:
            known = {h.node_id for h in self._hosts.values()} | self._adopting | self._refused_nodes
        for node_id, capacity in _hosting_nodes(self.config):
            if node_id not in known:
                with self._cond:
                    self._adopting.add(node_id)
                threading.Thread(target=self._adopt, args=(node_id, capacity), daemon=True).start()

    def _adopt(self, node_id: str, capacity: int) -> None:
        try:
            with self._cond:
                templates = tuple(s.template for s in self._served.values())
            self._start_host(node_id, capacity, templates)
            with self._cond:
                self._metrics.hosts_joined += 1
        except Exception:
            with self._cond:
                self._refused_nodes.add(node_id)  # not retried: a node that cannot host stays out
        finally:
            with self._cond:
                self._adopting.discard(node_id)

    # -- small helpers --------------------------------------------------------

    def _alive_hosts(self) -> list[HostRecord]:
        return [h for h in self._hosts.values() if h.alive]

    def _serving(self, snapshot_id: str) -> Served:
        served = self._served.get(snapshot_id)
        if served is None:
            raise PoolError(f"the pool does not serve snapshot {snapshot_id}; call pool.add(template) first")
        return served

    def _check_usable(self, served: Served) -> None:
        if self._closed:
            raise PoolClosedError("the pool is closed; create a new SandboxPool")
        if served.crash_looping:
            raise CrashLoopError(
                f"sandboxes of snapshot {served.snapshot.id} failed {len(served.failure_times)} times within "
                f"{self.config.failure_window_s:.0f} s, so the pool stopped recreating them; "
                f"last error: {served.last_error}"
            )

    def _summary_locked(self, served: Served) -> str:
        stats = self._snapshot_stats_locked(served)
        return ", ".join(f"{k}={v}" for k, v in stats.items() if k != "last_error")

    def _snapshot_stats_locked(self, served: Served) -> dict[str, Any]:
        mine = [s for s in self._slots.values() if s.snapshot_id == served.snapshot.id]
        return {
            "warm_target": served.warm_target,
            "ready": sum(1 for s in mine if s.state is SlotState.READY),
            "leased": sum(1 for s in mine if s.state is SlotState.LEASED),
            "restoring": sum(1 for s in mine if s.state is SlotState.RESTORING),
            "creating": served.creating,
            "crash_looping": served.crash_looping,
            "last_error": served.last_error,
        }


_REAP_WAIT_S = 300.0
"""How long a dead host's cloud sandboxes wait for a live host to end them."""


def _hosting_nodes(config: PoolConfig) -> list[tuple[str, int]]:
    """(node id, capacity) of every live node that hosts sandboxes.

    Nodes that declare the ``snapgym_host`` resource host sandboxes; if none
    does (a plain ``ray.init()``), every live node does.
    """
    import ray

    list_nodes: Any = ray.nodes
    nodes = [n for n in list_nodes() if n.get("Alive")]
    declared = [n for n in nodes if HOST_RESOURCE in n.get("Resources", {})]
    return [(n["NodeID"], int(n["Resources"].get(SLOTS_RESOURCE, config.host_capacity))) for n in (declared or nodes)]


def _describe(exc: BaseException) -> str:
    """One line for an error from an actor call, without Ray's remote traceback."""
    cause = raycalls.cause_of(exc)
    if cause is not exc and not isinstance(cause, SnapgymError):
        return f"{type(cause).__name__} in a pool host"
    message = str(cause).splitlines()[0] if str(cause) else ""
    return f"{type(cause).__name__}: {message}"


def _is_host_failure(exc: BaseException) -> bool:
    """Whether an actor call failed because the host itself is dead or broken."""
    from ray.exceptions import RayActorError

    # ConnectionError: the host's fast-path socket closed (its process died).
    return isinstance(exc, RayActorError | ConnectionError) or isinstance(raycalls.cause_of(exc), HostBrokenError)
