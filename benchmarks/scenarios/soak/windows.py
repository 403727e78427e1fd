"""One window of the soak: ``window`` episodes played ``pool.size`` at a time on one backend, measured.

Each episode is throughput's (a reset, the steps, a submit and the strict
verifier) on an environment of its own per worker thread, all of them on the
same backend. Per episode it records the restore (the env's
``reset_latency_s``: the sandbox put back at its snapshot) and the time to
first command (from the call of ``reset()`` to the return of the first step:
what an agent waits before its first command has run). The window as a whole
is accounted for by :func:`benchmarks.scenarios.cost.segments.measure` (the
run's own CPU by process kind, the machine's busy time), and the host's memory
cgroups, all and live, are counted half a second after its end.
"""

from __future__ import annotations

import os
import queue
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import envs
from benchmarks.scenarios.cost.accounting import KINDS, ProcessTable
from benchmarks.scenarios.cost.segments import SegmentCost, measure, memory_cgroups

CGROUP_ROOT = Path("/sys/fs/cgroup")
SETTLE_S = 0.5
"""Wait after a window before counting cgroups: the last instances' cgroups, removed off the request path by
the keepers' janitors, are dying for tens of milliseconds before the kernel frees them (a pile-up is what
outlives that)."""
LONG_LIVED = ("daemon", "keepers", "janitors")
"""The local backend's processes that serve many episodes (an instance lives for one)."""
SNAPGYM_CGROUPS = "snapgym"
"""The folder of the local backend's instance cgroups in each hierarchy (pool/backends/local/cgroups.py)."""


@dataclass(frozen=True, slots=True)
class Window:
    """The figures of one window of episodes."""

    index: int
    episodes: int
    first_command_ms: tuple[float, float]
    """Time to first command, p50 and p99."""
    restore_ms: tuple[float, float]
    """Restore (the env's reset latency), p50 and p99."""
    cost: SegmentCost
    """The window's CPU per episode by process kind, wall time and the host's memory cgroups before and after."""
    memory_cgroups: int
    """The host's memory cgroups, live and dying (``/proc/cgroups``), ``SETTLE_S`` after the window's end."""
    live_memory_cgroups: int
    """Of which live: directories of the hierarchy."""
    live_snapgym_memory_cgroups: int
    """Of which the local backend's instances' (anyone's on the host, this run's among them)."""
    processes: dict[str, int]
    """The runner's descendants by kind at the window's end (a leak of keepers or instances shows here)."""
    runner_rss_mib: float
    """The runner's resident memory at the window's end."""
    long_lived: dict[str, tuple[int, int]]
    """Of the processes that outlive episodes (daemons, keepers, janitors), by kind: the most mounts one of
    them sees in its mount namespace and the most fds one holds (a leak of either shows here)."""

    def as_dict(self) -> dict[str, Any]:
        """The window's row of summary.json."""
        return {
            "index": self.index,
            "episodes": self.episodes,
            "first_command_p50_ms": self.first_command_ms[0],
            "first_command_p99_ms": self.first_command_ms[1],
            "restore_p50_ms": self.restore_ms[0],
            "restore_p99_ms": self.restore_ms[1],
            "own_cpu_ms_per_episode": self.cost.own_ms,
            "cpu_ms_per_episode_by_kind": dict(self.cost.ms_by_kind),
            "machine_busy_ms_per_episode": self.cost.machine_busy_ms,
            "others_ms_per_episode": self.cost.machine_busy_ms - self.cost.own_ms,
            "wall_ms_per_episode": self.cost.wall_ms,
            "episodes_per_s": 1000.0 / self.cost.wall_ms if self.cost.wall_ms else 0.0,
            "memory_cgroups": self.memory_cgroups,
            "live_memory_cgroups": self.live_memory_cgroups,
            "dying_memory_cgroups": max(0, self.memory_cgroups - self.live_memory_cgroups),
            "live_snapgym_memory_cgroups": self.live_snapgym_memory_cgroups,
            "processes": dict(self.processes),
            "runner_rss_mib": self.runner_rss_mib,
            "long_lived": {kind: {"mounts": mounts, "fds": fds} for kind, (mounts, fds) in self.long_lived.items()},
        }


Timings = list[tuple[float, float]]
"""(time to first command, restore) in milliseconds, one pair per episode."""


def play_chunk(
    episodes: int, workers: ThreadPoolExecutor, pool: queue.Queue[gym.Env[Any, Any]], actions: Sequence[str]
) -> tuple[SegmentCost, Timings]:
    """Play ``episodes`` episodes on the environments in ``pool`` (one per worker); their cost and timings."""
    timings: Timings = []

    def one(_: int) -> None:
        env = pool.get()
        try:
            timings.append(play_episode(env, actions))
        finally:
            pool.put(env)

    def play() -> None:
        list(workers.map(one, range(episodes)))  # waits for all, re-raising an episode's error

    return measure(f"{episodes} episodes", episodes, play), timings


def window_of(index: int, chunks: Sequence[tuple[SegmentCost, Timings]]) -> Window:
    """The window that ``chunks`` make up (their costs weighted by episodes), its cgroups counted now."""
    timings = [pair for _, chunk in chunks for pair in chunk]
    first, restore = np.array([t[0] for t in timings]), np.array([t[1] for t in timings])
    cost = _merged([cost for cost, _ in chunks])
    time.sleep(SETTLE_S)
    total, (live, ours) = memory_cgroups(), live_memory_cgroups()
    return Window(index, cost.episodes, _p50_p99(first), _p50_p99(restore), cost, total, live, ours,
                  *_process_figures())  # fmt: skip


def _merged(costs: Sequence[SegmentCost]) -> SegmentCost:
    """One cost of several measured apart: per-episode figures averaged, weighted by their episodes."""
    if len(costs) == 1:
        return costs[0]
    episodes = sum(cost.episodes for cost in costs)

    def mean(values: Sequence[float]) -> float:
        return sum(value * cost.episodes for value, cost in zip(values, costs, strict=True)) / episodes

    kinds = {kind for cost in costs for kind in cost.ms_by_kind}
    return SegmentCost(
        name=costs[0].name, episodes=episodes,
        ms_by_kind={kind: mean([cost.ms_by_kind.get(kind, 0.0) for cost in costs]) for kind in kinds},
        kernel_ms_by_kind={kind: mean([cost.kernel_ms_by_kind.get(kind, 0.0) for cost in costs]) for kind in kinds},
        machine_busy_ms=mean([cost.machine_busy_ms for cost in costs]), wall_ms=mean([cost.wall_ms for cost in costs]),
        memory_cgroups=(costs[0].memory_cgroups[0], costs[-1].memory_cgroups[1]),
    )  # fmt: skip


def play_episode(env: gym.Env[Any, Any], actions: Sequence[str]) -> tuple[float, float]:
    """One strict episode; (time to first command, restore) in milliseconds.

    Raises:
        AssertionError: it scored other than 1.0, so the windows would not do the same work.
    """
    started = time.perf_counter()
    _, info = env.reset()
    for action in actions[:1]:
        env.step(action)
    first_command = time.perf_counter() - started
    for action in actions[1:]:
        env.step(action)
    _, reward, *_ = env.step(envs.SUBMIT)
    if reward != 1.0:
        raise AssertionError(f"a soak episode scored {reward}, not 1: the windows would not do the same work")
    return first_command * 1000, float(info["reset_latency_s"]) * 1000


def live_memory_cgroups() -> tuple[int, int]:
    """Memory cgroups that exist on the host (live ones), and of them the local backend's instances'."""
    hierarchy = CGROUP_ROOT / "memory"
    if not (hierarchy / "cgroup.procs").exists():  # cgroup v2: one hierarchy, the memory controller in most
        hierarchy = CGROUP_ROOT
    ours = hierarchy / SNAPGYM_CGROUPS
    return _folders(hierarchy), _folders(ours) - 1 if ours.is_dir() else 0


def _process_figures() -> tuple[dict[str, int], float, dict[str, tuple[int, int]]]:
    """The runner's descendants by kind, its resident memory in MiB, and the long-lived ones' mounts and fds."""
    processes = ProcessTable.now().processes.values()
    kinds = Counter(times.kind for times in processes if times.kind in KINDS)
    del kinds["runner"]
    with open("/proc/self/status", encoding="ascii") as status:
        rss_kib = next((int(line.split()[1]) for line in status if line.startswith("VmRSS:")), 0)
    long_lived: dict[str, tuple[int, int]] = {}
    for times in processes:
        if times.kind in LONG_LIVED:
            mounts, fds = _mounts_and_fds(times.pid)
            most = long_lived.get(times.kind, (0, 0))
            long_lived[times.kind] = (max(most[0], mounts), max(most[1], fds))
    return dict(sorted(kinds.items())), rss_kib / 1024, dict(sorted(long_lived.items()))


def _mounts_and_fds(pid: int) -> tuple[int, int]:
    """A process's mounts (its mount namespace's) and open fds; zeros when it is gone."""
    try:
        with open(f"/proc/{pid}/mountinfo", "rb") as mountinfo:
            mounts = mountinfo.read().count(b"\n")
        return mounts, len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0, 0


def _folders(top: Path) -> int:
    """``top`` and the folders under it (one removed during the walk is skipped)."""
    return sum(1 for _ in os.walk(top))


def _p50_p99(values: np.ndarray[Any, Any]) -> tuple[float, float]:
    if not len(values):
        return 0.0, 0.0
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))
