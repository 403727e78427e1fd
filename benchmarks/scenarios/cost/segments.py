"""The measured segments of the cost scenario and the CPU each used, by process kind.

A segment plays ``n`` episodes, or the first part of ``n`` episodes, and is
measured as a whole: the process tables before and after
(:mod:`benchmarks.scenarios.cost.accounting`), the machine's busy time from
``/proc/stat`` and the number of memory cgroups on the host (``/proc/cgroups``:
removed ones that page cache still holds are counted until it is reclaimed).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.scenarios.cost.accounting import KERNEL_THREADS, KINDS, ProcessTable, by_kind

_TICKS_PER_S = float(os.sysconf("SC_CLK_TCK"))
_SETTLE_S = 0.5


@dataclass(frozen=True, slots=True)
class SegmentCost:
    """CPU milliseconds per episode of one segment, in one round."""

    name: str
    episodes: int
    ms_by_kind: dict[str, float]
    """User plus kernel milliseconds per episode of each of the run's kinds (and kernel threads)."""
    kernel_ms_by_kind: dict[str, float]
    """The kernel part of it."""
    machine_busy_ms: float
    """Every CPU's busy time per episode: the run's processes, every other tenant's, interrupts."""
    wall_ms: float
    memory_cgroups: tuple[int, int]
    """The host's memory cgroups (live and dying) before and after."""

    @property
    def own_ms(self) -> float:
        """The run's own processes (kernel threads left out: they are the machine's)."""
        return sum(value for kind, value in self.ms_by_kind.items() if kind in KINDS)


def measure(name: str, episodes: int, play: Callable[[], object], *, period_s: float = 0.1) -> SegmentCost:
    """Run ``play`` (which plays ``episodes`` episodes, or a part of each) and account for its CPU.

    A sampler thread reads the process table every ``period_s`` (so processes that end inside
    the segment, a runner's daemon and its keepers, are seen with their last times); its own CPU
    is taken off the runner's.
    """
    time.sleep(_SETTLE_S)  # the previous segment's teardown (janitors, a closed daemon) is not this one's
    cgroups_before, busy_before = memory_cgroups(), _machine_busy_s()
    sampler = _Sampler(period_s)
    started = time.perf_counter()
    with sampler:
        play()
    wall = time.perf_counter() - started
    kinds = by_kind(sampler.tables)
    kinds["runner"] = kinds["runner"].plus(-sampler.cpu_s, 0.0)  # its reads of /proc: user and kernel, lumped
    busy = _machine_busy_s() - busy_before
    per = 1000.0 / episodes
    shown = (*KINDS, KERNEL_THREADS)
    return SegmentCost(
        name=name,
        episodes=episodes,
        ms_by_kind={kind: kinds[kind].total_s * per for kind in shown if kind in kinds},
        kernel_ms_by_kind={kind: kinds[kind].system_s * per for kind in shown if kind in kinds},
        machine_busy_ms=busy * per,
        wall_ms=wall * per,
        memory_cgroups=(cgroups_before, memory_cgroups()),
    )


class _Sampler:
    """Process tables every ``period_s`` while open, the first and the last included."""

    def __init__(self, period_s: float) -> None:
        self.tables: list[ProcessTable] = []
        self.cpu_s = 0.0
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="snapgym-cost-sampler", daemon=True)

    def __enter__(self) -> None:
        self.tables.append(ProcessTable.now())
        self._thread.start()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.tables.append(ProcessTable.now())

    def _run(self) -> None:
        started = time.thread_time()
        while not self._stop.wait(self._period_s):
            self.tables.append(ProcessTable.now())
        self.cpu_s = time.thread_time() - started


def memory_cgroups() -> int:
    """The host's memory cgroups, live and dying (``num_cgroups`` in ``/proc/cgroups``; 0: no memory controller)."""
    with open("/proc/cgroups", encoding="ascii") as table:
        for line in table:
            fields = line.split()
            if fields and fields[0] == "memory":
                return int(fields[2])
    return 0


def _machine_busy_s() -> float:
    with open("/proc/stat", encoding="ascii") as stat:
        ticks = [int(value) for value in stat.readline().split()[1:8]]
    return (ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]) / _TICKS_PER_S
