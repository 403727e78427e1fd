"""A timing loop that keeps set-up and tear-down out of the measurement."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def measure(
    operation: Callable[[], T],
    *,
    repetitions: int,
    warmup: int = 0,
    before: Callable[[], object] | None = None,
    after: Callable[[T], object] | None = None,
) -> list[float]:
    """Time ``operation`` alone, ``warmup + repetitions`` times.

    Args:
        operation: the call being measured.
        repetitions: timed iterations kept.
        warmup: iterations run first and discarded.
        before: called before each iteration, not timed.
        after: called with the operation's result after each iteration, not timed.

    Returns:
        Wall time of each kept iteration in milliseconds (``time.perf_counter_ns``).
    """
    if repetitions < 0 or warmup < 0:
        raise ValueError(f"repetitions and warmup must be >= 0, got {repetitions} and {warmup}")
    samples: list[float] = []
    for index in range(warmup + repetitions):
        if before is not None:
            before()
        started = time.perf_counter_ns()
        result = operation()
        elapsed_ns = time.perf_counter_ns() - started
        if after is not None:
            after(result)
        if index >= warmup:
            samples.append(elapsed_ns / 1e6)
    return samples
