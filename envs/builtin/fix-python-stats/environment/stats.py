"""Small descriptive statistics helpers used by the reporting scripts."""

from __future__ import annotations

import math
from collections.abc import Iterable


def _as_list(data: Iterable[float]) -> list[float]:
    values = list(data)
    if not values:
        raise ValueError("need at least one data point")
    return values


def mean(data: Iterable[float]) -> float:
    """Arithmetic mean of ``data``. Raises ValueError on empty input."""
    values = _as_list(data)
    return sum(values) / len(values)


def median(data: Iterable[float]) -> float:
    """Middle value of ``data`` (the mean of the two middle values for an even count).

    The input does not need to be sorted. Raises ValueError on empty input.
    """
    values = _as_list(data)
    n = len(values)
    mid = n // 2
    if n % 2 == 1:
        return values[mid]
    return (values[mid - 1] + values[mid]) / 2


def variance(data: Iterable[float]) -> float:
    """Sample variance of ``data`` (sum of squared deviations divided by n - 1).

    Raises ValueError when fewer than two data points are given.
    """
    values = list(data)
    if len(values) < 2:
        raise ValueError("variance requires at least two data points")
    m = mean(values)
    return sum((x - m) ** 2 for x in values) / len(values)


def stdev(data: Iterable[float]) -> float:
    """Sample standard deviation: the square root of :func:`variance`."""
    return math.sqrt(variance(data))
