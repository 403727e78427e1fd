"""Soak: no slowdown with the work served (issue 34 item 5).

Method:
    ``episodes`` episodes (default 10,000) of the throughput benchmark's
    trivial task (:mod:`benchmarks.scenarios.throughput`: a reset, ``steps``
    steps whose first solves the task, a submit and the strict verifier) on
    one backend, ``pool.size`` at a time: one environment per worker thread,
    all on the job's one backend (its daemon serves every episode), after
    ``warmup_episodes`` discarded ones. The episodes are played in windows of
    ``window`` (default 1,000); each window reports the time to first command
    (from ``reset()`` to the first step's return) and the restore (the env's
    reset latency) at p50 and p99, the run's own CPU per episode by process
    kind (:mod:`benchmarks.scenarios.cost.accounting`, through the cost
    scenario's :func:`~benchmarks.scenarios.cost.segments.measure`), the
    machine's busy time, the runner's descendants by kind and its resident
    memory, and the host's memory cgroups half a second after its end (the
    last instances' cgroups freed): all of them (``num_cgroups`` in
    ``/proc/cgroups``, dying ones included), the live ones (directories of the
    hierarchy) and the local backend's instances'.

    Verdicts: the last window's time to first command p50, restore p50 and own
    CPU per episode each within ``tolerance`` (10%) of the first window's; and
    at no window's end more dying memory cgroups on the host (all of them less
    the live ones) than before the first window (after the warm-up) plus
    ``cgroup_multiple`` times the live sandboxes (``pool.size``): dying ones
    are what piles up, while the live ones come and go with other tenants'
    containers and sandboxes. p99s and the machine's busy time are reported as
    ratios too, not judged: on a shared machine they move with the other
    tenants.

    Unless ``fresh_control=false``, the last window is played beside a window
    on a fresh backend (a new daemon, the same warm-up), the two alternating
    in tenths (:data:`CONTROL_PARTS`, each side first half the time), so both
    see the same load: the last window against the fresh one is "after
    ``episodes`` episodes" against "the first ones" with the machine's drift
    (a neighbour's load, which no growth of the soaked backend explains) taken
    out. Reported beside the verdicts, not judged, as is each judged figure's
    trend from the first window to the last with the other tenants' CPU per
    episode taken out (:func:`~benchmarks.scenarios.soak.report.trend`).
    Needs ``pool=direct`` (the episodes run in this process, whose
    descendants the accounting counts).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.episodes.recording import rundir
from benchmarks.job import Job
from benchmarks.scenarios.cost import machine
from benchmarks.scenarios.cost.segments import SegmentCost, memory_cgroups
from benchmarks.scenarios.soak import report
from benchmarks.scenarios.soak.server import Server
from benchmarks.scenarios.soak.windows import SETTLE_S, Timings, Window, live_memory_cgroups, window_of
from pool import ConfigError

CONTROL_PARTS = 10
"""The last window and the fresh backend's alternate in this many parts each, so that both see the same load."""


@dataclass
class SoakConfig:
    """Time to first command, restore, CPU per episode and memory cgroups over many episodes on one backend."""

    name: str = "soak"
    """Scenario name."""
    episodes: int = 10_000
    """Episodes measured, in windows of ``window``: a multiple of it, at least two windows."""
    window: int = 1_000
    """Episodes per window; the first window and the last are compared."""
    warmup_episodes: int = 20
    """Episodes played first and discarded (the snapshot built, every worker's sandbox and spare made)."""
    steps: int = 3
    """Steps per episode, as throughput's."""
    tolerance: float = 0.10
    """How much the last window's time to first command, restore (p50s) and CPU may exceed the first's."""
    cgroup_multiple: float = 4.0
    """Memory cgroups the host may gain over the soak, per live sandbox."""
    fresh_control: bool = True
    """Play the last window alternating with one on a fresh backend (a new daemon): the last window against
    it, under the same load, tells the machine's drift (a neighbour's load) from the soaked backend's own."""


@dataclass
class SoakOutcome:
    """The windows and the verdicts made of them."""

    figures: dict[str, Any] = field(default_factory=dict)

    def write(self, output_dir: Path) -> Path:
        """summary.json and soak.md; returns summary.json's path."""
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "soak.md").write_text(self.table() + "\n")
        path = output_dir / "summary.json"
        path.write_text(json.dumps(self.figures, indent=2) + "\n")
        return path

    def table(self) -> str:
        """The window table and the verdicts."""
        return report.markdown(self.figures)


def run(job: Job) -> SoakOutcome:
    """Play the windows on one backend and judge the last against the first; see the module docstring."""
    cfg: SoakConfig = job.settings
    _check(cfg, job)
    run_dir, config, _ = rundir.resolve(job.config, job.output_dir, given=job.given)
    size, count = int(config.pool.size), cfg.episodes // cfg.window
    with Server(job.backend, size, cfg.steps) as soaked:
        soaked.warm(cfg.warmup_episodes)
        time.sleep(SETTLE_S)
        before = memory_cgroups() - live_memory_cgroups()[0]
        windows = [window_of(index, [soaked.chunk(cfg.window)]) for index in range(count - 1)]
        if cfg.fresh_control:
            last, control = _beside_a_fresh_backend(job, soaked, cfg, size, count - 1)
        else:
            last, control = window_of(count - 1, [soaked.chunk(cfg.window)]), None
    method = {"episodes": cfg.episodes, "window": cfg.window, "warmup_episodes": cfg.warmup_episodes,
              "steps": cfg.steps, "pool_size": size, "backend": str(config.backend.name),
              "fresh_control_parts": CONTROL_PARTS if cfg.fresh_control else 0}  # fmt: skip
    figures = report.summary(
        [*windows, last], control, dying_before=before, live_sandboxes=size, tolerance=cfg.tolerance,
        cgroup_multiple=cfg.cgroup_multiple, machine=machine(), method=method,
    )  # fmt: skip
    outcome = SoakOutcome(figures)
    outcome.write(run_dir)
    return outcome


def _beside_a_fresh_backend(job: Job, soaked: Server, cfg: SoakConfig, size: int, index: int) -> tuple[Window, Window]:
    """The soaked backend's last window and a fresh backend's, played in alternating parts (same load on both)."""
    parts = [cfg.window // CONTROL_PARTS + (part < cfg.window % CONTROL_PARTS) for part in range(CONTROL_PARTS)]
    ours: list[tuple[SegmentCost, Timings]] = []
    theirs: list[tuple[SegmentCost, Timings]] = []
    with Server(job.open_backend(), size, cfg.steps) as fresh:
        fresh.warm(cfg.warmup_episodes)
        for number, part in enumerate(episodes for episodes in parts if episodes):
            sides = [(soaked, ours), (fresh, theirs)]
            for server, chunks in sides if number % 2 == 0 else sides[::-1]:  # each goes first half the time
                chunks.append(server.chunk(part))
        return window_of(index, ours), window_of(index + 1, theirs)


def _check(cfg: SoakConfig, job: Job) -> None:
    """Refuse settings that would not measure what the soak reports.

    Raises:
        ConfigError: a Ray pool, or episodes that are not at least two whole windows.
    """
    if str(getattr(job.config.pool.kind, "name", job.config.pool.kind)) != "direct":
        raise ConfigError("benchmark=soak accounts for the runner's own processes; run it with pool=direct")
    if cfg.window < 1 or cfg.episodes < 2 * cfg.window or cfg.episodes % cfg.window:
        raise ConfigError(
            f"benchmark.episodes={cfg.episodes} is not two or more whole windows of benchmark.window={cfg.window}: "
            "set episodes to a multiple of window, at least twice it (the first window is compared with the last)"
        )
    if cfg.tolerance < 0 or cfg.cgroup_multiple < 0:
        raise ConfigError("benchmark.tolerance and benchmark.cgroup_multiple must be zero or more")
