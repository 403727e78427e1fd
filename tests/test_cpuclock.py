"""The machine CPU clock: busy seconds over a window, with a real CPU load and a real idle spell."""

from __future__ import annotations

import os
import time

import pytest

from benchmarks.cpuclock import MachineCPU


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_busy_spell_counts_about_one_core_and_an_idle_one_little() -> None:
    """One thread spinning for 0.6 s is about 0.6 busy seconds (other work on the machine may add some);
    sleeping is far less; a window outside what was sampled is refused."""
    with MachineCPU(period_s=0.02) as cpu:
        idle_start = time.time()
        time.sleep(0.6)
        idle_end = busy_start = time.time()
        _spin(0.6)
        busy_end = time.time()
    busy, idle = cpu.between(busy_start, busy_end), cpu.between(idle_start, idle_end)
    assert busy.wall_s == pytest.approx(0.6, abs=0.05)
    assert 0.4 <= busy.busy_s <= 0.6 * (os.cpu_count() or 1) + 0.05
    assert idle.busy_s < busy.busy_s - 0.3
    assert busy.steal_s >= 0
    with pytest.raises(ValueError, match="not inside the sampled span"):
        cpu.between(idle_start - 10, busy_end)
    with pytest.raises(ValueError):
        cpu.between(busy_end, busy_start)
