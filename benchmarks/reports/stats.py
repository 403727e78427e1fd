"""Percentiles of latency samples."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Percentiles and mean of one method's samples, in milliseconds."""

    p50_ms: float
    """Median."""
    p90_ms: float
    """90th percentile."""
    p99_ms: float
    """99th percentile (with fewer than 100 samples, close to the maximum)."""
    mean_ms: float
    """Arithmetic mean."""
    n: int
    """Number of samples."""


def percentile(samples_ms: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linearly interpolated between samples.

    Raises:
        ValueError: ``samples_ms`` is empty.
    """
    if not samples_ms:
        raise ValueError("no samples to take a percentile of")
    return float(np.percentile(np.asarray(samples_ms, dtype=float), q))


def summarize(samples_ms: Sequence[float]) -> LatencySummary:
    """p50, p90, p99, mean and count of latency samples in milliseconds.

    Raises:
        ValueError: ``samples_ms`` is empty.
    """
    if not samples_ms:
        raise ValueError("no samples to summarize")
    data = np.asarray(samples_ms, dtype=float)
    p50, p90, p99 = np.percentile(data, [50, 90, 99])
    return LatencySummary(float(p50), float(p90), float(p99), float(data.mean()), int(data.size))
