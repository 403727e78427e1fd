"""A lease: a pooled sandbox on loan, usable exactly like a Sandbox.

Every call goes to the host actor that holds the sandbox. A background thread
in the holder's process renews its leases; if the process dies, renewals stop
and the pool reclaims the sandbox after the lease's time-to-live. If the host
dies, the lease's calls raise :class:`LeaseLostError` (a SandboxCrashedError,
so environments end the episode as an infrastructure failure).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from pool.basesandbox import BaseSandbox, ExecOptions
from pool.changes import MAX_PATHS, Changes
from pool.cluster.calls import raycalls
from pool.cluster.calls.fastpath import FastPathClient
from pool.cluster.slots import LeaseGrant
from pool.errors import HostBrokenError, LeaseLostError, SandboxClosedError, SandboxError
from pool.network.audit import NetworkLog
from pool.network.policy import NetworkPolicy, Phase
from pool.results import ExecResult
from pool.snapshots import Snapshot
from pool.verification import VerificationPlan, VerificationReport


class Lease(BaseSandbox):
    """A sandbox from a :class:`SandboxPool`, until ``release()`` (or ``close()``)."""

    def __init__(
        self,
        manager: Any,
        grant: LeaseGrant,
        host: Any,
        snapshot: Snapshot,
        *,
        host_fast: FastPathClient | None = None,
        manager_fast: FastPathClient | None = None,
        identities: dict[tuple[str, int], tuple[str, dict[str, str]]] | None = None,
    ) -> None:
        super().__init__(snapshot)
        self._manager = manager
        self._grant = grant
        self._host = host
        self._host_fast = host_fast
        self._manager_fast = manager_fast
        self._lost: str | None = None
        self._failed: str | None = None
        self._host_gone = False
        self._identities = identities if identities is not None else {}
        _renewer.register(self)

    # -- identity -------------------------------------------------------------

    @property
    def lease_id(self) -> str:
        """The pool's name for this loan."""
        return self._grant.lease_id

    @property
    def node_id(self) -> str:
        """The Ray node whose host holds the sandbox."""
        return self._grant.node_id

    @property
    def id(self) -> str:
        """The leased sandbox's id (its backend's name for it)."""
        return self._identity()[0]

    @property
    def labels(self) -> Mapping[str, str]:
        """The leased sandbox's labels (``snapgym.pool`` among them)."""
        return dict(self._identity()[1])

    def _identity(self) -> tuple[str, dict[str, str]]:
        key = (self._grant.host_id, self._grant.slot)
        identity = self._identities.get(key)
        if identity is None:
            identity = self._identities[key] = self._call("identity")
        return identity

    @property
    def is_alive(self) -> bool:
        """True while the lease is held and its host answers."""
        return not self._closed and self._lost is None and self._failed is None

    # -- the Sandbox API --------------------------------------------------------

    def _exec(self, command: str, options: ExecOptions) -> ExecResult:
        """:meth:`exec` in the leased sandbox, by its host."""
        result: ExecResult = self._call("exec", command, options.keywords())
        return result

    def _shell(self, command: str, options: ExecOptions) -> ExecResult:
        """:meth:`shell` in the leased sandbox, by its host."""
        result: ExecResult = self._call("shell", command, options.keywords())
        return result

    def run_beside(self, function: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """``function(sandbox, *args, **kwargs)`` in the host's process, beside the sandbox (pool.cluster.beside)."""
        return self._call("run_beside", function, args, dict(kwargs))

    def read_file(self, path: str, *, max_bytes: int | None = None, follow_symlinks: bool = True) -> bytes:
        """Bytes of a regular file in the sandbox."""
        data: bytes = self._call("read_file", path, max_bytes, follow_symlinks)
        return data

    def begin_verification(self, plan: VerificationPlan) -> VerificationReport:
        """Hand the leased sandbox to its verifier until the next restore (see pool.verification)."""
        report: VerificationReport = self._call("begin_verification", plan)
        return report

    def set_network(self, policy: NetworkPolicy, *, phase: Phase) -> dict[str, str]:
        """Give the leased sandbox a network policy until its next restore (see Sandbox.set_network)."""
        env: dict[str, str] = self._call("set_network", policy, phase)
        return env

    def network_log(self) -> NetworkLog:
        """The leased sandbox's connection attempts since the last call or restore."""
        log: NetworkLog = self._call("network_log")
        return log

    def changes(self, *, max_paths: int = MAX_PATHS) -> Changes:
        """The leased sandbox's changes since it started (see Sandbox.changes)."""
        changes: Changes = self._call("changes", max_paths)
        return changes

    def write_file(self, path: str, data: str | bytes, *, mode: int | None = None) -> None:
        """Write a file in the sandbox, creating parent directories."""
        self._call("write_file", path, data, mode)

    def snapshot(self) -> Snapshot:
        """Freeze the current state; it can be restored on this lease (the same host)."""
        snapshot: Snapshot = self._call("snapshot")
        return snapshot

    def restore(self, snapshot: Snapshot | None = None) -> None:
        """Go back to a snapshot taken on this host, or in its store (default: the lease's start)."""
        target = snapshot or self._snapshot
        report = self._call("restore", target)
        if not report.ok:
            self._failed = report.error
            raise SandboxError(f"restore failed on the pool's host: {report.error}; release the lease")
        self._snapshot = target

    def release(self) -> None:
        """Give the sandbox back; the pool restores it in the background. Idempotent."""
        if self._closed:
            return
        self._closed = True
        _renewer.unregister(self)
        with contextlib.suppress(Exception):  # the pool is gone: nothing to give back to
            if self._host_gone:  # let the pool check the host at once, before it hands out more of its sandboxes
                self._manager_call("report_host_failure", self._grant.host_id)
            elif self._lost is None:  # a reclaimed lease is the pool's already
                self._manager_call("release", self.lease_id, self._failed)

    def close(self) -> None:
        """Same as release()."""
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._closed else ("lost" if self._lost else "held")
        return f"Lease({self.lease_id[:8]}, slot {self._grant.slot} on node {self.node_id[:8]}, {state})"

    # -- internals ------------------------------------------------------------

    def _call(self, method: str, *args: Any) -> Any:
        if self._closed:
            raise SandboxClosedError(f"{self!r} was released; acquire a new lease from the pool")
        if self._lost is not None:
            raise LeaseLostError(f"{self!r} is lost: {self._lost}")
        if self._failed is not None:
            raise SandboxError(f"{self!r} broke ({self._failed}); release it and acquire a new one")
        try:
            return self._call_host(method, (self._grant.slot, self._grant.epoch), *args)
        except LeaseLostError as exc:
            self._lost = str(exc)
            raise

    def _call_host(self, method: str, ticket: tuple[int, int], *args: Any) -> Any:
        from ray.exceptions import RayActorError

        lost = f"{self!r}: the host holding the sandbox died; acquire a new lease"
        try:
            if self._host_fast is not None:
                return self._host_fast.call(method, ticket, *args)
            return raycalls.get(getattr(self._host, method).remote(ticket, *args))
        except (ConnectionError, RayActorError, HostBrokenError):
            self._host_gone = True
            raise LeaseLostError(lost) from None

    def _manager_call(self, method: str, *args: Any) -> None:
        if self._manager_fast is not None:
            self._manager_fast.call(method, *args)
        else:
            getattr(self._manager, method).remote(*args)

    def _mark_lost(self, why: str) -> None:
        self._lost = why


class _Renewer:
    """One thread per process that renews the leases this process holds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: weakref.WeakValueDictionary[str, Lease] = weakref.WeakValueDictionary()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def register(self, lease: Lease) -> None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child starts with no thread
                self._thread, self._pid = None, os.getpid()
            self._leases[lease.lease_id] = lease
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="snapgym-lease-renewer", daemon=True)
                self._thread.start()

    def unregister(self, lease: Lease) -> None:
        with self._lock:
            self._leases.pop(lease.lease_id, None)

    def _run(self) -> None:
        import ray

        while True:
            with self._lock:
                leases = list(self._leases.values())
            if leases:
                period = min(lease._grant.ttl_s for lease in leases) / 3
                by_manager: dict[Any, list[Lease]] = {}
                for lease in leases:
                    by_manager.setdefault(lease._manager, []).append(lease)
                for manager, held in by_manager.items():
                    try:
                        lost = set(ray.get(manager.renew.remote([lease.lease_id for lease in held]), timeout=10))
                    except Exception:
                        continue
                    for lease in held:
                        if lease.lease_id in lost and not lease.is_closed:
                            lease._mark_lost("the pool reclaimed it (its renewals stopped arriving in time)")
            else:
                period = 1.0
            time.sleep(max(period, 0.05))


_renewer = _Renewer()
