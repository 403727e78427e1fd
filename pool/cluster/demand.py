"""The warm target of each served snapshot: how many READY sandboxes the pool keeps beside those in use.

The target starts at ``min_warm``. While acquires wait, it doubles once per
tick (at least to the number of waiters, at most ``max_warm``). Once no
acquire has waited for ``idle_s``, it drops by one each second, and the READY
slots that went unused since the last check are given back, never one an
acquire needed. A slot being restored counts toward the target: it is ready in
milliseconds, and otherwise every release under steady load would open a
sandbox that the next shrink check destroys again.

These functions only decide; the manager opens and gives back the sandboxes.
"""

from __future__ import annotations

from pool.cluster.config import PoolConfig
from pool.cluster.slots import Served


def deficit(served: Served, *, restoring: int, room: int) -> int:
    """How many sandboxes to open for ``served`` now (``room``: how many the pool may still open)."""
    return min(served.warm_target - len(served.ready) - served.creating - restoring, room)


def leased(served: Served) -> None:
    """Note how many READY slots an acquire left: the fewest since the last shrink check were never needed."""
    left = len(served.ready)
    served.low_ready = left if served.low_ready is None else min(served.low_ready, left)


def warm_up(served: Served, config: PoolConfig, n: int, now: float) -> None:
    """Raise the target to ``n`` (capped at ``max_size``) and count it as demand, so no shrink comes for ``idle_s``."""
    served.warm_target = max(served.warm_target, min(n, config.max_size))
    served.last_wait_at = served.last_grow_at = now


def grow(served: Served, config: PoolConfig, now: float) -> None:
    """An acquire waits: double the target, at most once per tick."""
    if now - served.last_grow_at >= config.tick_s:
        served.warm_target = min(config.max_warm, max(served.warm_target * 2, served.waiters, 1))
        served.last_grow_at = now


def shrink(served: Served, config: PoolConfig, now: float) -> int:
    """Once no acquire has waited for ``idle_s``, each second: lower the target by one; returns how
    many READY slots to give back (those unused since the last check, down to the target)."""
    if now - served.last_wait_at < config.idle_s or now - served.last_grow_at < 1.0:
        return 0
    surplus = len(served.ready) if served.low_ready is None else served.low_ready
    served.low_ready = None
    served.last_grow_at = now
    if surplus <= 0:  # an acquire took the last ready slot: every one of them is in use
        return 0
    if served.warm_target > config.min_warm:
        served.warm_target -= 1
    return max(0, min(surplus, len(served.ready) - served.warm_target))
