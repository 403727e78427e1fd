"""A started sandbox kept ready for each snapshot that is created again and again.

``create()`` that finds one takes it: its namespaces are set up and its keeper waits, so the
caller's first command is the first thing that happens (time to first command). The next
one is asked for in the same call and not waited for; the create after that collects it. A
snapshot gets a ready sandbox only from its second ``create()`` on, so a caller that creates
one sandbox per snapshot and restores it every episode (an environment, a pool) never pays
for an idle one. What a ready sandbox holds is a fresh start of its snapshot, the same as a
sandbox created on the spot; it is a warm pool of one, inside the backend.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pool.backends.local.daemon.client import PendingReply
    from pool.backends.local.sandbox import LocalSandbox

Started = tuple["LocalSandbox", "PendingReply"]
"""A sandbox whose CREATE request was sent, and the reply to wait for."""


class ReadySandboxes:
    """At most one started sandbox per snapshot id; thread-safe."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._waiting: dict[str, Started] = {}
        self._asked: set[str] = set()

    def take(self, snapshot_id: str) -> Started | None:
        """The ready sandbox of ``snapshot_id``, if one was started; it is the caller's from now on."""
        with self._lock:
            return self._waiting.pop(snapshot_id, None)

    def wants_one(self, snapshot_id: str) -> bool:
        """Record a create() of ``snapshot_id``; True when a ready one should be started for the next."""
        with self._lock:
            again = snapshot_id in self._asked
            self._asked.add(snapshot_id)
            return self.enabled and again and snapshot_id not in self._waiting

    def put(self, snapshot_id: str, started: Started) -> Started | None:
        """Keep ``started`` for the next create(); returns one it replaced (the caller closes it)."""
        with self._lock:
            previous = self._waiting.get(snapshot_id)
            self._waiting[snapshot_id] = started
            return previous

    def drain(self) -> list[Started]:
        """Every sandbox still waiting (at close), handed to the caller."""
        with self._lock:
            waiting = list(self._waiting.values())
            self._waiting.clear()
            return waiting
