"""Counters and latency samples of a SandboxPool, summarised by stats()."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

_SAMPLES = 10_000


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
