"""The naive reset: copy the workspace to a fresh directory and start a fresh process.

Its cost depends on the filesystem it copies onto (tmpfs is several times
faster than a disk filesystem, and steadier), so the scenario reports it.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path

from benchmarks.scenarios.measure.timing import measure


def copy_latency(source: Path, scratch: Path, *, repetitions: int, warmup: int) -> list[float]:
    """Time ``shutil.copytree(source, <new dir>)`` plus ``subprocess.run(["true"])``.

    Each iteration copies into a directory that does not exist yet under
    ``scratch``; deleting the copy happens after the clock stops.

    Returns:
        Milliseconds per timed iteration.
    """
    names = itertools.count()

    def reset() -> Path:
        target = scratch / f"copy-{next(names)}"
        shutil.copytree(source, target)
        subprocess.run(["true"], check=True)
        return target

    return measure(reset, repetitions=repetitions, warmup=warmup, after=shutil.rmtree)


def filesystem_type(path: Path) -> str:
    """Type of the filesystem holding ``path`` (e.g. ``ext4``, ``tmpfs``), from /proc/mounts."""
    target = path.resolve()
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if target.is_relative_to(point) and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind
