"""The machine CPU clock: busy seconds over a window, against this thread's own CPU time in it.

The clock is machine-wide by design, and the suite runs beside other tests, so the checks bound it
by what this test itself did (it must be counted) and by what the machine can do at most.
"""

from __future__ import annotations

import os
import time

import pytest

from benchmarks.scenarios.measure.cpuclock import MachineCPU


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_busy_spell_is_counted_and_bounded_by_the_machine() -> None:
    """A thread spinning for 0.6 s: the machine's busy time in that window holds at least the CPU
    time the thread got, and at most every core for the window; steal is apart; a window outside
    what was sampled is refused."""
    with MachineCPU(period_s=0.02) as cpu:
        time.sleep(0.1)
        started, own_before = time.time(), time.thread_time()
        _spin(0.6)
        ended, own = time.time(), time.thread_time() - own_before
        time.sleep(0.1)
    window = cpu.between(started, ended)
    assert window.wall_s == pytest.approx(ended - started)
    assert own > 0.1  # the thread ran
    assert own - 0.05 <= window.busy_s <= window.wall_s * (os.cpu_count() or 1) + 0.05
    assert window.steal_s >= 0
    with pytest.raises(ValueError, match="not inside the sampled span"):
        cpu.between(started - 10, ended)
    with pytest.raises(ValueError):
        cpu.between(ended, started)
