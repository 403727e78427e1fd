"""One machine's sandboxes, served to the pool: the body of the Ray host actor.

A host owns one backend (for the local backend: one daemon) and many
sandboxes, each in a numbered slot. The pool talks to hosts only through the
methods here, so a host also runs without Ray (as in the unit tests); the Ray
actor is this class with ``ray.remote`` options (:func:`host_actor_class`).
Every method is thread-safe: a threaded actor runs many at once.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pool.capabilities import Capabilities
from pool.changes import Changes
from pool.cluster.calls.fastpath import FastPathServer
from pool.cluster.orphans import exit_when_orphaned
from pool.contract import Backend, ReapsLabelled, Sandbox
from pool.errors import HostBrokenError, LeaseLostError, SandboxError, SnapgymError
from pool.network.audit import NetworkLog
from pool.network.policy import NetworkPolicy, Phase
from pool.results import ExecResult
from pool.snapshots import Snapshot
from pool.templates import Template
from pool.verification import VerificationPlan, VerificationReport

BackendFactory = Callable[[], Backend]
_LEASE_METHOD_NAMES = (
    "exec", "read_file", "write_file", "snapshot", "restore", "start_digest", "begin_verification", "identity",
    "set_network", "network_log", "changes", "shell", "run_beside",
)  # fmt: skip
LEASE_METHODS = frozenset(_LEASE_METHOD_NAMES)
"""What a lease may call on its host (through Ray, or the same-node fast path).

Each takes a ticket ``(slot, epoch)`` first. The pool bumps a slot's epoch
every time it takes the slot back, so a holder whose lease was reclaimed can
no longer reach the sandbox the next holder uses.
"""
Ticket = tuple[int, int]
POOL_METHODS = frozenset({"recycle"})
"""What the pool's manager calls on the same-node fast path (its hot call: once per episode)."""


@dataclass(frozen=True, slots=True)
class RestoreReport:
    """What a restore did, for the pool's statistics."""

    slot: int
    ok: bool
    duration_s: float
    error: str | None = None
    host_broken: bool = False
    """The failure was the host's backend dying, not this sandbox."""


class SandboxHost:
    """Sandboxes of one node, addressed by slot number.

    Args:
        backend_factory: makes the backend on first use (inside the actor's process).
        capacity: the most sandboxes this host keeps at once.
    """

    def __init__(
        self, backend_factory: BackendFactory, *, capacity: int, labels: Mapping[str, str] | None = None
    ) -> None:
        self._factory = backend_factory
        self._labels = dict(labels or {})
        self._backend: Backend | None = None
        self.capacity = capacity
        self._lock = threading.Lock()
        self._slots: dict[int, Sandbox] = {}
        self._epochs: dict[int, int] = {}
        self._snapshots: dict[str, Snapshot] = {}
        self._ids = itertools.count(1)
        self.started_at = time.time()
        # Many threads wait on sandboxes here; hand the GIL over quickly when a reply lands.
        sys.setswitchinterval(0.0005)
        self._fastpath = FastPathServer(self, LEASE_METHODS | POOL_METHODS)
        if _in_ray_worker():
            exit_when_orphaned()

    # -- lifecycle ------------------------------------------------------------

    def ping(self) -> dict[str, Any]:
        """Liveness and identity: node, pid, slot count, fast-path socket.

        Raises:
            HostBrokenError: the backend's sandbox daemon died.
        """
        self._check_backend()
        return {
            "pid": os.getpid(),
            "node": _node_id(),
            "slots": len(self._slots),
            "capacity": self.capacity,
            "fastpath": self._fastpath.path,
        }

    def build(self, template: Template) -> Snapshot:
        """Build a template on this node (a cache hit after the first time)."""
        snapshot = self.backend.build(template)
        self._snapshots[snapshot.id] = snapshot
        return snapshot

    def adopt(self, snapshot: Snapshot) -> None:
        """Serve a snapshot another host built, when snapshots live where every node reaches them."""
        self._snapshots[snapshot.id] = snapshot

    def capabilities(self) -> Capabilities:
        """The capabilities of this host's backend."""
        return self.backend.capabilities

    def reap_labelled(self, labels: Mapping[str, str]) -> int:
        """End every sandbox carrying ``labels`` that this host's backend can list (a cloud backend's:
        another host's, which died); how many. 0 where the backend cannot list by label."""
        return int(self.backend.reap_labelled(labels)) if isinstance(self.backend, ReapsLabelled) else 0

    def open(self, snapshot_id: str, n: int) -> list[int]:
        """Start ``n`` sandboxes at a snapshot this host knows; returns their slots."""
        snapshot = self._snapshot(snapshot_id)
        with self._lock:
            free = self.capacity - len(self._slots)
        n = min(n, free)
        if n <= 0:
            return []
        self._check_backend()
        try:
            sandboxes = self.backend.fork(snapshot, n, labels=self._labels)
        except SnapgymError:
            self._check_backend()
            raise
        slots = []
        with self._lock:
            for sandbox in sandboxes:
                slot = next(self._ids)
                self._slots[slot] = sandbox
                self._epochs[slot] = 0
                slots.append(slot)
        return slots

    def destroy(self, slot: int) -> None:
        """Close a slot's sandbox. Idempotent."""
        with self._lock:
            sandbox = self._slots.pop(slot, None)
            self._epochs.pop(slot, None)
        if sandbox is not None:
            with contextlib.suppress(SnapgymError):
                sandbox.close()

    def close(self) -> None:
        """Close every sandbox and the backend."""
        with self._lock:
            slots = list(self._slots)
        for slot in slots:
            self.destroy(slot)
        if self._backend is not None:
            self._backend.close()
        self._fastpath.close()

    # -- what a lease does ----------------------------------------------------

    def recycle(self, slot: int, snapshot_id: str, epoch: int) -> RestoreReport:
        """Take a slot back for the pool: restore it to the pool's snapshot and start a new epoch.

        Failures are reported, not raised.
        """
        with self._lock:
            if slot in self._epochs:
                self._epochs[slot] = epoch  # first, so the old holder is locked out at once
        return self._restore(slot, snapshot_id)

    # -- what a lease does (a ticket first) -----------------------------------

    def restore(self, ticket: Ticket, snapshot: Snapshot | str | None = None) -> RestoreReport:
        """Put a leased sandbox back at a snapshot (default: its last start): one built or taken on this
        host, by id, or a ``Snapshot`` from this host's store that an earlier process took (a durable
        episode's checkpoint, after the runner restarted). The backend proves its layers against its
        digest before the sandbox starts from it; one this node's store lacks fails the restore."""
        self._sandbox(ticket)
        if isinstance(snapshot, Snapshot):
            with self._lock:
                self._snapshots.setdefault(snapshot.id, snapshot)
            snapshot = snapshot.id
        return self._restore(ticket[0], snapshot)

    def exec(self, ticket: Ticket, command: str, options: Mapping[str, Any]) -> ExecResult:
        """Run a command (``options``: the keyword arguments of Sandbox.exec)."""
        return self._sandbox(ticket).exec(command, **options)

    def shell(self, ticket: Ticket, command: str, options: Mapping[str, Any]) -> ExecResult:
        """Run a command in the sandbox's persistent shell (``options``: the keyword arguments of Sandbox.shell)."""
        return self._sandbox(ticket).shell(command, **options)

    def read_file(self, ticket: Ticket, path: str, max_bytes: int | None, follow_symlinks: bool = True) -> bytes:
        """A file from the sandbox."""
        return self._sandbox(ticket).read_file(path, max_bytes=max_bytes, follow_symlinks=follow_symlinks)

    def begin_verification(self, ticket: Ticket, plan: VerificationPlan) -> VerificationReport:
        """Hand the leased sandbox to its verifier (see Sandbox.begin_verification)."""
        return self._sandbox(ticket).begin_verification(plan)

    def set_network(self, ticket: Ticket, policy: NetworkPolicy, phase: Phase) -> dict[str, str]:
        """Give the leased sandbox a network policy (see Sandbox.set_network)."""
        return dict(self._sandbox(ticket).set_network(policy, phase=phase))

    def network_log(self, ticket: Ticket) -> NetworkLog:
        """The leased sandbox's connection attempts since the last call."""
        return self._sandbox(ticket).network_log()

    def changes(self, ticket: Ticket, max_paths: int) -> Changes:
        """The leased sandbox's changes since it started (see Sandbox.changes)."""
        return self._sandbox(ticket).changes(max_paths=max_paths)

    def write_file(self, ticket: Ticket, path: str, data: str | bytes, mode: int | None) -> None:
        """Write a file into the sandbox."""
        self._sandbox(ticket).write_file(path, data, mode=mode)

    def snapshot(self, ticket: Ticket) -> Snapshot:
        """Snapshot the sandbox's current state; later restores on this host may use it."""
        snapshot = self._sandbox(ticket).snapshot()
        self._snapshots[snapshot.id] = snapshot
        return snapshot

    def start_digest(self, ticket: Ticket) -> str:
        """The digest the sandbox last started from."""
        return self._sandbox(ticket).start_digest

    def run_beside(
        self, ticket: Ticket, function: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        """``function(sandbox, *args, **kwargs)`` here, beside the sandbox (see pool.cluster.beside)."""
        return function(self._sandbox(ticket), *args, **kwargs)

    def identity(self, ticket: Ticket) -> tuple[str, dict[str, str]]:
        """The sandbox's id and labels."""
        sandbox = self._sandbox(ticket)
        return sandbox.id, dict(sandbox.labels)

    def stats(self) -> dict[str, Any]:
        """Slot count and this process's memory (resident set), for the pool's statistics."""
        return {"slots": len(self._slots), "capacity": self.capacity, "rss_bytes": _rss_bytes(), "node": _node_id()}

    def machine_memory(self) -> tuple[str, int]:
        """(machine id, bytes in use on the machine: MemTotal - MemAvailable).

        The machine id is the kernel's boot id, so two Ray nodes on one machine report one machine.
        """
        return _machine_id(), used_memory_bytes()

    # -- internals ------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The backend, made on first use."""
        with self._lock:
            if self._backend is None:
                self._backend = self._factory()
            return self._backend

    def _restore(self, slot: int, snapshot_id: str | None) -> RestoreReport:
        started = time.perf_counter()
        try:
            sandbox = self._slots.get(slot)
            if sandbox is None:
                raise SandboxError(f"slot {slot} holds no sandbox on this host (it was destroyed)")
            sandbox.restore(self._snapshot(snapshot_id) if snapshot_id else None)
        except SnapgymError as exc:
            error = f"{type(exc).__name__}: {exc}"
            return RestoreReport(slot, False, time.perf_counter() - started, error, host_broken=not self._backend_ok())
        return RestoreReport(slot, True, time.perf_counter() - started)

    def _sandbox(self, ticket: Ticket) -> Sandbox:
        slot, epoch = ticket
        with self._lock:
            sandbox = self._slots.get(slot)
            current = self._epochs.get(slot)
        if sandbox is None:
            raise LeaseLostError(f"slot {slot} holds no sandbox on this host any more (it was destroyed)")
        if current != epoch:
            raise LeaseLostError("the pool reclaimed this lease (its renewals stopped arriving in time)")
        return sandbox

    def _backend_ok(self) -> bool:
        return self._backend is None or self._backend.health is None

    def _check_backend(self) -> None:
        reason = None if self._backend is None else self._backend.health
        if reason is not None:
            raise HostBrokenError(f"this host's backend cannot serve ({reason}); the pool replaces the host")

    def _snapshot(self, snapshot_id: str) -> Snapshot:
        snapshot = self._snapshots.get(snapshot_id)
        if snapshot is None:
            raise SandboxError(f"snapshot {snapshot_id} was not built or taken on this host")
        return snapshot


def _node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # not in a Ray worker
        return None


def _in_ray_worker() -> bool:
    try:
        import ray

        return bool(ray.is_initialized()) and ray.get_runtime_context().worker.mode == ray.WORKER_MODE
    except Exception:
        return False


def used_memory_bytes() -> int:
    """MemTotal - MemAvailable of this machine, from /proc/meminfo."""
    fields = {}
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            key, value = line.split(":", 1)
            fields[key] = int(value.split()[0]) * 1024
    return fields["MemTotal"] - fields["MemAvailable"]


def _machine_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return boot.read().strip()
    except OSError:
        return os.uname().nodename


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def host_actor_class(*, max_concurrency: int = 256) -> Any:
    """:class:`SandboxHost` as a Ray actor class: threaded, no CPU reserved, never restarted by Ray.

    The pool replaces dead hosts itself, because a restart would re-run the
    constructor with every sandbox gone anyway.
    """
    from pool.cluster.calls.raycalls import actor_class

    return actor_class(SandboxHost, num_cpus=0, max_concurrency=max_concurrency, max_restarts=0)
