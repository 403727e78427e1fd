"""The pool's brain, run as one Ray actor: it hands out leases and takes them back.

It keeps, for each snapshot it serves, a warm target of READY sandboxes
(pool.cluster.demand) beside the ones in use, spread over host actors (one per
node, started and replaced by pool.cluster.supervisor). ``acquire`` hands out
a READY slot at once when there is one; ``release`` starts the slot's restore
in the background and the slot is READY again when the host reports success.
A maintenance thread refills, shrinks idle targets and reclaims leases whose
holder stopped renewing them. Every restore or creation failure is counted
(pool.cluster.slots keeps the books); too many in a window stop the recreation
of that snapshot's sandboxes (a crash loop) with the last error.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pool.capabilities import Capabilities
from pool.cluster import demand
from pool.cluster.calls import raycalls
from pool.cluster.calls.fastpath import FastPathServer
from pool.cluster.config import PoolConfig
from pool.cluster.host import BackendFactory, RestoreReport
from pool.cluster.orphans import exit_when_orphaned
from pool.cluster.slots import HostRecord, LeaseGrant, Served, Slot, SlotBook
from pool.cluster.supervisor import HostSupervisor
from pool.errors import AcquireTimeoutError, PoolError, SnapshotError
from pool.snapshots import Snapshot
from pool.templates import Template

_OPEN_CHUNK = 16
_RECYCLERS = 32


class PoolManager:
    """Leases of a SandboxPool's slots (runs inside a threaded Ray actor)."""

    def __init__(self, config: PoolConfig, backend_factory: BackendFactory) -> None:
        self.config = config
        self._book = SlotBook(config)
        self._cond = self._book.cond
        # Ray runs future callbacks on its own threads, where calling Ray again can deadlock;
        # the callbacks only hand their results to this thread.
        self._events = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapgym-pool-events")
        # Restores on this node's hosts go through their fast path (a Ray call costs the manager
        # and the host about 2 ms of CPU each, once per episode); each waits on one of these threads.
        self._recyclers = ThreadPoolExecutor(max_workers=_RECYCLERS, thread_name_prefix="snapgym-pool-recycle")
        self.pool_id = f"pool-{uuid.uuid4().hex[:12]}"
        """Every sandbox of the pool carries it as its ``snapgym.pool`` label."""
        self._supervisor = HostSupervisor(self._book, backend_factory, self.pool_id, refill_locked=self._refill_locked)
        exit_when_orphaned()
        self._supervisor.start_hosts()
        self._fastpath = FastPathServer(self, frozenset({"acquire", "release", "renew", "report_host_failure"}))
        threading.Thread(target=self._maintain, name="snapgym-pool", daemon=True).start()
        threading.Thread(target=self._supervisor.watch, name="snapgym-pool-health", daemon=True).start()

    # -- the API a SandboxPool calls ------------------------------------------

    def add(self, template: Template) -> Snapshot:
        """Build a template on every host and keep warm sandboxes of it."""
        hosts = self._book.alive_hosts()
        import ray

        if self._supervisor.shares_snapshots(hosts[0]):  # built once, where every node reaches it
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
            served = self._book.served.get(snapshot.id)
            if served is None:
                served = self._book.served[snapshot.id] = Served(snapshot, template, warm_target=self.config.min_warm)
            self._refill_locked(served)
        return snapshot

    def acquire(self, snapshot_id: str, timeout_s: float | None, holder: str) -> LeaseGrant:
        """A READY slot, leased to ``holder``; waits up to ``timeout_s`` for one."""
        started = time.monotonic()
        deadline = started + (timeout_s if timeout_s is not None else self.config.acquire_timeout_s)
        with self._cond:
            served = self._book.serving(snapshot_id)
            while True:
                self._book.check_usable(served)
                slot = self._book.pop_ready_locked(served)
                if slot is not None:
                    grant = self._book.lease_locked(slot, served, holder, time.monotonic() - started)
                    demand.leased(served)
                    self._refill_locked(served)
                    return grant
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AcquireTimeoutError(
                        f"no sandbox of snapshot {snapshot_id} became ready in {deadline - started:.1f} s "
                        f"({self._book.summary_locked(served)}); raise max_size or the acquire timeout"
                    )
                served.waiters += 1
                served.last_wait_at = time.monotonic()
                demand.grow(served, self.config, time.monotonic())
                self._refill_locked(served)
                self._cond.wait(min(remaining, self.config.tick_s))
                served.waiters -= 1

    def release(self, lease_id: str, failed: str | None = None) -> None:
        """Take a slot back and restore it in the background; ``failed`` says the sandbox broke."""
        with self._cond:
            slot = self._book.leases.pop(lease_id, None)
            if slot is None or slot.key not in self._book.slots:
                return
            self._book.metrics.releases += 1
            if failed is not None:
                slot.lease_id = None
                self._book.fail_slot_locked(slot, failed)
            else:
                self._restore_locked(slot)

    def renew(self, lease_ids: list[str]) -> list[str]:
        """Mark leases as still held; returns the ones the pool no longer has."""
        now = time.monotonic()
        lost = []
        with self._cond:
            for lease_id in lease_ids:
                slot = self._book.leases.get(lease_id)
                if slot is None:
                    lost.append(lease_id)
                else:
                    slot.renewed_at = now
        return lost

    def report_host_failure(self, host_id: str) -> None:
        """A lease found its host gone: check it now, so no acquire is handed its dead sandboxes."""
        host = self._book.hosts.get(host_id)
        if host is not None and host.alive:
            self._supervisor.check(host)

    def stats(self) -> dict[str, Any]:
        """Slot counts by state, latency percentiles, failures, hosts, and per-snapshot targets."""
        with self._cond:
            return self._book.stats_locked()

    def machine_memory(self) -> dict[str, int]:
        """Bytes in use on each machine that hosts sandboxes (machine id -> MemTotal - MemAvailable)."""
        import ray

        reports = ray.get([h.handle.machine_memory.remote() for h in self._book.alive_hosts()], timeout=60)
        return dict(reports)

    def wait_ready(self, snapshot_id: str, n: int, timeout_s: float) -> int:
        """Wait until ``n`` sandboxes of a snapshot are READY (for warm-up); returns how many are."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            served = self._book.serving(snapshot_id)
            demand.warm_up(served, self.config, n, time.monotonic())
            while len(served.ready) < n and time.monotonic() < deadline and not served.crash_looping:
                self._refill_locked(served)
                self._cond.wait(min(self.config.tick_s, max(deadline - time.monotonic(), 0.0)))
            return len(served.ready)

    def close(self) -> None:
        """Destroy every sandbox and host actor."""
        import ray

        with self._cond:
            self._book.closed = True
            hosts = list(self._book.hosts.values())
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
            return self._book.health_locked()

    def capabilities(self) -> Capabilities:
        """The capabilities of the hosts' backend (every host runs the same backend and options)."""
        import ray

        hosts = self._book.alive_hosts()
        if not hosts:
            raise PoolError(self.health() or "no live sandbox host")
        capabilities: Capabilities = ray.get(hosts[0].handle.capabilities.remote(), timeout=120)
        return capabilities

    def host_info(self, host_id: str) -> tuple[Any, str | None]:
        """The actor handle and fast-path socket of a host, for clients to cache."""
        with self._cond:
            host = self._book.hosts[host_id]
            return host.handle, host.fastpath

    def fastpath(self) -> str:
        """The manager's fast-path socket, for clients on its node."""
        return self._fastpath.path

    def snapshot(self, snapshot_id: str) -> Snapshot:
        """A served snapshot by id."""
        with self._cond:
            snapshot: Snapshot = self._book.serving(snapshot_id).snapshot
            return snapshot

    # -- restoring and opening sandboxes on the hosts ---------------------------

    def _restore_locked(self, slot: Slot) -> None:
        self._book.take_back_locked(slot)
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
            error, host_broken = raycalls.describe(exc), raycalls.is_host_failure(exc)
        if host_broken:
            self._supervisor.host_died(slot.host)
            return
        with self._cond:
            if slot.key not in self._book.slots or self._book.closed:
                return
            if report is not None and report.ok:
                self._book.ready_locked(slot, report.duration_s)
            else:
                self._book.fail_slot_locked(slot, error or "restore failed")

    def _refill_locked(self, served: Served) -> None:
        if served.crash_looping or self._book.closed:
            return
        restoring = self._book.restoring_locked(served)
        deficit = demand.deficit(served, restoring=restoring, room=self._book.room_locked())
        while deficit > 0:
            host = max(self._book.alive_hosts(), key=lambda h: h.free, default=None)
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
            numbers, error, host_broken = [], raycalls.describe(exc), raycalls.is_host_failure(exc)
        with self._cond:
            host.creating -= asked
            served.creating -= asked
            if not host_broken and not self._book.closed:
                self._book.opened_locked(host, served, numbers, error)
        if host_broken:
            self._supervisor.host_died(host)

    # -- maintenance ----------------------------------------------------------

    def _maintain(self) -> None:
        while True:
            with self._cond:
                if self._book.closed:
                    return
                now = time.monotonic()
                for slot in self._book.expired_locked(now):
                    self._restore_locked(slot)
                for served in self._book.served.values():
                    self._book.give_back_locked(served, demand.shrink(served, self.config, now))
                    self._refill_locked(served)
                self._cond.wait(self.config.tick_s)
