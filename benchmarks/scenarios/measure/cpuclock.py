"""Machine-wide CPU seconds over a window: what an episode costs, whatever else the hypervisor does.

Episodes per second on a shared VM swing with the host's load (these machines
lose up to half their time to steal). The CPU time the machine spent in the
same window, divided by the episodes, moves much less: it counts the work,
not the waiting. A sampler thread reads ``/proc/stat`` every ``period_s``;
:meth:`MachineCPU.between` interpolates linearly between samples, so a window
that starts or ends between two samples is charged its share.

Busy time is user + nice + system + irq + softirq of every process on the
machine (Ray's daemons, the sandbox daemon and the sandboxes included). Steal
is reported beside it, never inside.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from dataclasses import dataclass

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class CPUWindow:
    """CPU seconds the machine spent in a window of wall-clock time."""

    wall_s: float
    busy_s: float
    """Seconds of any CPU running anything (user, nice, system, irq, softirq)."""
    steal_s: float
    """Seconds the hypervisor ran something else while this machine wanted to run."""


class MachineCPU:
    """Samples ``/proc/stat`` while open (``with MachineCPU() as cpu: ...``)."""

    def __init__(self, *, period_s: float = 0.05) -> None:
        self._period_s = period_s
        self._times: list[float] = []
        self._busy: list[float] = []
        self._steal: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="snapgym-cpu-clock", daemon=True)

    def __enter__(self) -> MachineCPU:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def between(self, start: float, end: float) -> CPUWindow:
        """The machine's CPU seconds from ``start`` to ``end`` (``time.time()`` values inside the sampled span).

        Raises:
            ValueError: the window is empty or reaches outside what was sampled.
        """
        if not self._times or end <= start or start < self._times[0] or end > self._times[-1]:
            raise ValueError(
                f"window {start:.3f}..{end:.3f} is not inside the sampled span "
                f"{self._times[0] if self._times else 0:.3f}..{self._times[-1] if self._times else 0:.3f}"
            )
        busy = self._at(self._busy, end) - self._at(self._busy, start)
        steal = self._at(self._steal, end) - self._at(self._steal, start)
        return CPUWindow(wall_s=end - start, busy_s=busy, steal_s=steal)

    def _at(self, series: list[float], moment: float) -> float:
        right = min(max(bisect.bisect_left(self._times, moment), 1), len(self._times) - 1)
        t0, t1 = self._times[right - 1], self._times[right]
        share = 0.0 if t1 == t0 else (moment - t0) / (t1 - t0)
        return series[right - 1] + share * (series[right] - series[right - 1])

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            self._sample()

    def _sample(self) -> None:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
        # cpu user nice system idle iowait irq softirq steal guest guest_nice
        ticks = [int(value) for value in fields[1:9]]
        busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]
        self._times.append(time.time())
        self._busy.append(busy / _TICKS_PER_S)
        self._steal.append(ticks[7] / _TICKS_PER_S)
