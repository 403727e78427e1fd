"""Host supervision: host actors on every hosting node, pinged, replaced when they die.

The supervisor starts a host actor on each node that hosts sandboxes, pings
every host each second (one that fails or hangs is killed and its slots are
dropped, to be recreated elsewhere), restarts a dead node's host up to
``max_host_restarts`` times, and adopts hosting nodes that join the cluster
later. A new host is registered only once the served templates are built (or,
for a backend whose snapshots are remote, adopted) on it, so no refill opens a
sandbox of a snapshot the host does not have yet. The dead host's cloud
sandboxes live on at the provider; a live host ends them by their labels.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from pool.cluster.calls.fastpath import FastPathClient, reachable
from pool.cluster.config import HOST_RESOURCE, SLOTS_RESOURCE, PoolConfig
from pool.cluster.host import BackendFactory, host_actor_class
from pool.cluster.slots import HostRecord, Served, SlotBook
from pool.errors import PoolError, SnapshotError
from pool.labels import HOST, POOL
from pool.snapshots import Snapshot
from pool.templates import Template

_PING_EVERY_S = 1.0
_PING_TIMEOUT_S = 30.0
_NODE_SCAN_EVERY_S = 5.0
"""How often the pool looks for hosting nodes that joined the cluster."""
_REAP_WAIT_S = 300.0
"""How long a dead host's cloud sandboxes wait for a live host to end them."""


class HostSupervisor:
    """Starts, watches and replaces a pool's host actors, recording them in its SlotBook.

    Args:
        book: the pool's records; a host joins ``book.hosts`` once it is ready.
        factory: makes each host's backend.
        pool_id: the ``snapgym.pool`` label of every sandbox of the pool.
        refill_locked: called under ``book.cond`` for each served snapshot once a host joins.
    """

    def __init__(
        self, book: SlotBook, factory: BackendFactory, pool_id: str, *, refill_locked: Callable[[Served], None]
    ) -> None:
        self._book = book
        self._config = book.config
        self._factory = factory
        self._pool_id = pool_id
        self._refill_locked = refill_locked
        self._host_class = host_actor_class()
        self._node_restarts: Counter[str] = Counter()
        self._adopting: set[str] = set()
        self._refused_nodes: set[str] = set()
        self.snapshots_shared: bool | None = None
        """Whether the backend's snapshots live where every node reaches them (read from its capabilities)."""

    def start_hosts(self) -> None:
        """Start a host on every hosting node.

        Raises:
            PoolError: no node can host sandboxes.
        """
        for node_id, capacity in _hosting_nodes(self._config):
            self._start_host(node_id, capacity)
        if not self._book.hosts:
            raise PoolError("no Ray node can host sandboxes; start one with resources {'snapgym_host': 1}")

    def shares_snapshots(self, host: HostRecord) -> bool:
        """``Capabilities.snapshot_location == "remote"``, asked of a host once."""
        import ray

        if self.snapshots_shared is None:
            capabilities = ray.get(host.handle.capabilities.remote(), timeout=120)
            self.snapshots_shared = capabilities.snapshot_location == "remote"
        return self.snapshots_shared

    def check(self, host: HostRecord) -> None:
        """Ping a host now (a lease found it gone), so no acquire is handed its dead sandboxes."""
        import ray

        try:
            ray.get(host.handle.ping.remote(), timeout=5)
        except Exception:
            self.host_died(host)

    def watch(self) -> None:
        """Ping every host each second (one that fails or hangs is replaced), and look for new nodes."""
        last_scan = time.monotonic()
        while not self._book.closed:
            time.sleep(_PING_EVERY_S)
            self._check_hosts()
            if time.monotonic() - last_scan >= _NODE_SCAN_EVERY_S:
                last_scan = time.monotonic()
                with contextlib.suppress(Exception):  # the GCS may be briefly unreachable
                    self._adopt_new_nodes()

    def host_died(self, host: HostRecord) -> None:
        """Drop a dead or broken host's slots, kill it, end its cloud sandboxes, and start a replacement."""
        import ray

        with self._book.cond:
            if not self._book.host_died_locked(host):
                return
        with contextlib.suppress(Exception):  # broken or hung: make sure it is gone with its sandboxes
            ray.kill(host.handle, no_restart=True)
        if self.snapshots_shared:  # a cloud backend: the dead host's sandboxes live on at the provider
            threading.Thread(target=self._reap_remote, args=(host,), daemon=True).start()
        threading.Thread(target=self._replace_host, args=(host,), daemon=True).start()

    def _check_hosts(self) -> None:
        import ray

        hosts = self._book.alive_hosts()
        pings = {h.handle.ping.remote(): h for h in hosts}
        ready, hung = ray.wait(list(pings), num_returns=len(pings), timeout=_PING_TIMEOUT_S)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:
                self.host_died(pings[ref])
        for ref in hung:
            self.host_died(pings[ref])

    def _reap_remote(self, dead: HostRecord) -> None:
        """End a dead host's provider sandboxes through a live host (each carries the pool and host
        labels), waiting for the replacement when no other host lives; the provider's lifetime ends
        them anyway if none comes."""
        import ray

        labels = {POOL: self._pool_id, HOST: dead.id}
        deadline = time.monotonic() + _REAP_WAIT_S
        while time.monotonic() < deadline and not self._book.closed:
            for host in self._book.alive_hosts():
                try:
                    reaped = ray.get(host.handle.reap_labelled.remote(labels), timeout=120)
                except Exception:
                    continue
                with self._book.cond:
                    self._book.metrics.remote_reaped += int(reaped)
                return
            time.sleep(0.5)

    def _replace_host(self, dead: HostRecord) -> None:
        if self._node_restarts[dead.node_id] >= self._config.max_host_restarts:
            return
        if dead.node_id not in {node_id for node_id, _ in _hosting_nodes(self._config)}:
            return
        self._node_restarts[dead.node_id] += 1
        try:
            self._start_host(dead.node_id, dead.capacity, self._templates())
        except Exception:
            return
        with self._book.cond:
            self._book.metrics.host_restarts += 1

    def _templates(self) -> tuple[Template, ...]:
        with self._book.cond:
            return tuple(s.template for s in self._book.served.values())

    def _start_host(self, node_id: str, capacity: int, templates: tuple[Template, ...] = ()) -> HostRecord:
        """Start a host actor on a node, build the served templates there, then register it.

        Raises:
            SnapshotError: a template built to another digest on this node (its userland differs).
        """
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        host_id = uuid.uuid4().hex[:12]
        handle = self._host_class.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
        ).remote(self._factory, capacity=capacity, labels={POOL: self._pool_id, HOST: host_id})
        info = ray.get(handle.ping.remote(), timeout=120)
        if templates and self.snapshots_shared:
            with self._book.cond:
                snapshots = [s.snapshot for s in self._book.served.values()]
            ray.get([handle.adopt.remote(snapshot) for snapshot in snapshots], timeout=120)
        elif templates:
            self._build_alike(handle, node_id, templates)
        fastpath = info.get("fastpath")
        fast = FastPathClient(fastpath) if reachable(fastpath) else None
        record = HostRecord(host_id, node_id, handle, capacity, fastpath=fastpath, fast=fast)
        with self._book.cond:
            self._book.hosts[record.id] = record
            for served in self._book.served.values():
                self._refill_locked(served)
        return record

    def _build_alike(self, handle: Any, node_id: str, templates: tuple[Template, ...]) -> None:
        """Build the templates on a new host; kill it if one builds to another digest than the pool's."""
        import ray

        built: list[Snapshot] = ray.get([handle.build.remote(t) for t in templates], timeout=600)
        with self._book.cond:
            expected = {s.snapshot.id: s.snapshot.digest for s in self._book.served.values()}
        foreign = [b for b in built if b.id in expected and expected[b.id] != b.digest]
        if foreign:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)
            raise SnapshotError(
                f"node {node_id[:8]} built {foreign[0].id} to another digest: its host userland differs"
            )

    def _adopt_new_nodes(self) -> None:
        """Start hosts on hosting nodes that joined the cluster after the pool started."""
        with self._book.cond:
            known = {h.node_id for h in self._book.hosts.values()} | self._adopting | self._refused_nodes
        for node_id, capacity in _hosting_nodes(self._config):
            if node_id not in known:
                with self._book.cond:
                    self._adopting.add(node_id)
                threading.Thread(target=self._adopt, args=(node_id, capacity), daemon=True).start()

    def _adopt(self, node_id: str, capacity: int) -> None:
        try:
            self._start_host(node_id, capacity, self._templates())
            with self._book.cond:
                self._book.metrics.hosts_joined += 1
        except Exception:
            with self._book.cond:
                self._refused_nodes.add(node_id)  # not retried: a node that cannot host stays out
        finally:
            with self._book.cond:
                self._adopting.discard(node_id)


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
