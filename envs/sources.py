"""Where an environment's sandboxes come from: a backend directly, or a SandboxPool.

With a backend, reset restores the sandbox in place (a sub-millisecond
hand-off to a pre-warmed spare on the local backend). With a pool, reset
hands the used sandbox back (the pool restores it in the background) and
leases a ready one: the way to spread environments over a Ray cluster.
Checkpoints are restored in place in both cases, because a checkpoint lives
on the node where it was taken.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Protocol

from pool.contract import Backend, Sandbox
from pool.errors import SandboxError, SnapgymError
from pool.snapshots import Snapshot
from pool.templates import Template


class SandboxSource(Protocol):
    """What an environment needs to get sandboxes."""

    name: str

    def prepare(self, template: Template) -> Snapshot:
        """Build (or find) the template's snapshot."""

    def place(self, current: Sandbox | None, target: Snapshot, *, task_snapshot: Snapshot) -> Sandbox:
        """A sandbox at ``target``, reusing ``current`` when that is the cheaper way."""

    def fork(self, snapshot: Snapshot, n: int, *, task_snapshot: Snapshot) -> list[Sandbox]:
        """``n`` sandboxes at ``snapshot``."""


class BackendSource:
    """Sandboxes made by a backend and restored in place, carrying ``labels``."""

    def __init__(self, backend: Backend, labels: Mapping[str, str] | None = None) -> None:
        self.backend = backend
        self.name = backend.name
        self.labels = dict(labels or {})

    def prepare(self, template: Template) -> Snapshot:
        return self.backend.build(template)

    def place(self, current: Sandbox | None, target: Snapshot, *, task_snapshot: Snapshot) -> Sandbox:
        if current is not None:
            try:
                current.restore(target)
                return current
            except SandboxError:
                discard(current)
        return self.backend.create(target, labels=self.labels)

    def fork(self, snapshot: Snapshot, n: int, *, task_snapshot: Snapshot) -> list[Sandbox]:
        return list(self.backend.fork(snapshot, n, labels=self.labels))


class PoolSource:
    """Sandboxes leased from a SandboxPool; a reset hands the old one back."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.name = "pool"

    def prepare(self, template: Template) -> Snapshot:
        snapshot: Snapshot = self.pool.add(template)
        return snapshot

    def place(self, current: Sandbox | None, target: Snapshot, *, task_snapshot: Snapshot) -> Sandbox:
        if target.id != task_snapshot.id:
            # A checkpoint: it lives on the node where it was taken, so restore in place.
            if current is None:
                current = self.pool.acquire(task_snapshot)
            current.restore(target)
            return current
        if current is not None:
            discard(current)
        lease: Sandbox = self.pool.acquire(task_snapshot)
        return lease

    def fork(self, snapshot: Snapshot, n: int, *, task_snapshot: Snapshot) -> list[Sandbox]:
        leases: list[Sandbox] = []
        try:
            for _ in range(n):
                leases.append(self.pool.acquire(task_snapshot))
                leases[-1].restore(snapshot)
        except SnapgymError:
            for lease in leases:
                discard(lease)
            raise
        return leases


def discard(sandbox: Sandbox) -> None:
    """Close a sandbox (or hand a lease back), ignoring errors of a dead one."""
    with contextlib.suppress(SnapgymError):
        sandbox.close()
