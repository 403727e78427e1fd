"""The measured segments of the cost scenario and the CPU each used, by process kind.

A segment plays ``n`` episodes, or the first part of ``n`` episodes, and is
measured as a whole: the process tables before and after
(:mod:`benchmarks.scenarios.cost.accounting`), the machine's busy time from
``/proc/stat`` and the number of memory cgroups on the host (``/proc/cgroups``:
removed ones that page cache still holds are counted until it is reclaimed).

A run through the runner also has a steady state (:func:`steady_state`): the
tables sampled between its first episode's start and its last episode's end,
per episode that ended between them, without what a run costs once (its
pool started and closed, the task's calibration, the report), as the
throughput benchmark's window counts it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
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


@dataclass(frozen=True, slots=True)
class Sample:
    """The process table at one moment, with the wall clock and the machine's busy seconds then."""

    at: float
    """``time.time()``: the clock the ledger's ``started_at`` and ``finished_at`` use."""
    busy_s: float
    table: ProcessTable


class Sampled:
    """A played segment's samples (the first before it, the last after it) and the sampler's own CPU."""

    def __init__(self, samples: list[Sample], sampler_cpu_s: float, wall_s: float, cgroups: tuple[int, int]) -> None:
        self.samples = samples
        self.sampler_cpu_s = sampler_cpu_s
        self.wall_s = wall_s
        self.cgroups = cgroups

    def cost(self, name: str, episodes: int) -> SegmentCost:
        """The whole segment's cost per episode."""
        return _cost(name, episodes, self.samples, self.sampler_cpu_s, self.wall_s, self.cgroups)


def measure(name: str, episodes: int, play: Callable[[], object], *, period_s: float = 0.1) -> SegmentCost:
    """Run ``play`` (which plays ``episodes`` episodes, or a part of each) and account for its CPU.

    A sampler thread reads the process table every ``period_s`` (so processes that end inside
    the segment, a runner's daemon and its keepers, are seen with their last times); its own CPU
    is taken off the runner's.
    """
    return sample(play, period_s=period_s).cost(name, episodes)


def sample(play: Callable[[], object], *, period_s: float = 0.1) -> Sampled:
    """Run ``play`` with the sampler on (see :func:`measure`); the samples, to be accounted for."""
    time.sleep(_SETTLE_S)  # the previous segment's teardown (janitors, a closed daemon) is not this one's
    cgroups_before = memory_cgroups()
    sampler = _Sampler(period_s)
    started = time.perf_counter()
    with sampler:
        play()
    wall = time.perf_counter() - started
    return Sampled(sampler.samples, sampler.cpu_s, wall, (cgroups_before, memory_cgroups()))


def steady_state(name: str, sampled: Sampled, episodes: Sequence[tuple[float, float]]) -> SegmentCost | None:
    """The cost per episode between the first episode's start and the last one's end.

    ``episodes``: each episode's ``(started_at, finished_at)``. The first sample taken after the
    first start and the last one taken before the last end bound the window; the episodes that
    ended inside it are what it is divided by (with several in flight, those cut by its edges
    even out). None when the window holds no two samples or no episode ended in it.
    """
    if not episodes:
        return None
    first_start, last_end = min(start for start, _ in episodes), max(end for _, end in episodes)
    inside = [index for index, s in enumerate(sampled.samples) if first_start <= s.at <= last_end]
    if len(inside) < 2:
        return None
    window = sampled.samples[inside[0] : inside[-1] + 1]
    ended = sum(1 for _, end in episodes if window[0].at < end <= window[-1].at)
    if ended == 0:
        return None
    share = (window[-1].at - window[0].at) / max(sampled.wall_s, 1e-9)  # of the sampler's CPU, by wall time
    return _cost(name, ended, window, sampled.sampler_cpu_s * share, window[-1].at - window[0].at, (0, 0))


def _cost(
    name: str, episodes: int, samples: Sequence[Sample], sampler_cpu_s: float, wall_s: float, cgroups: tuple[int, int]
) -> SegmentCost:  # fmt: skip
    kinds = by_kind([s.table for s in samples])
    kinds["runner"] = kinds["runner"].plus(-sampler_cpu_s, 0.0)  # its reads of /proc: user and kernel, lumped
    busy = samples[-1].busy_s - samples[0].busy_s
    per = 1000.0 / episodes
    shown = (*KINDS, KERNEL_THREADS)
    return SegmentCost(
        name=name,
        episodes=episodes,
        ms_by_kind={kind: kinds[kind].total_s * per for kind in shown if kind in kinds},
        kernel_ms_by_kind={kind: kinds[kind].system_s * per for kind in shown if kind in kinds},
        machine_busy_ms=busy * per,
        wall_ms=wall_s * per,
        memory_cgroups=cgroups,
    )


class _Sampler:
    """Samples every ``period_s`` while open, the first and the last included."""

    def __init__(self, period_s: float) -> None:
        self.samples: list[Sample] = []
        self.cpu_s = 0.0
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="snapgym-cost-sampler", daemon=True)

    def __enter__(self) -> None:
        self.samples.append(_sample())
        self._thread.start()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(_sample())

    def _run(self) -> None:
        started = time.thread_time()
        while not self._stop.wait(self._period_s):
            self.samples.append(_sample())
        self.cpu_s = time.thread_time() - started


def _sample() -> Sample:
    return Sample(time.time(), _machine_busy_s(), ProcessTable.now())


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
