"""What the store's proofs cost: the check before first use, snapshots of sparse and deep trees.

Run ``python -m benchmarks.scenarios.store_check [--tasks]`` (as root or rootless, like the
backend). Methodology: every store is a fresh temporary one on the filesystem of
``$TMPDIR``. "first use" is timed in a new Python process (so nothing was checked
yet) from ``LocalBackend(...)`` being built to ``store.check(snapshot)``
returning; a first process after a commit may re-read entries written in the
commit's last clock tick (racy entries) and records their keys, so the first use
is timed in two new processes in a row ("first" and "steady"). "later use" is the
same check again in that process. ``verify`` rehashes every byte. Times are
medians of three runs in milliseconds; the machine is shared, so expect noise.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pool import LocalBackend, Snapshot, Template
from pool.backends.local.store.layers import remove_tree

T = TypeVar("T")

_PROBE = """
import json, sys, time
started = time.perf_counter()
from pool import LocalBackend
b = LocalBackend(store_dir=sys.argv[1])
snap = b.store.get(sys.argv[2])
t0 = time.perf_counter(); b.store.check(snap); first = time.perf_counter() - t0
t0 = time.perf_counter(); b.store.check(snap); later = time.perf_counter() - t0
print(json.dumps({"first_ms": first * 1e3, "later_ms": later * 1e3}))
b.close()
"""
_FILES = """
import os
for d in range(20):
    os.makedirs(f"data/{d}", exist_ok=True)
    for f in range(50):
        with open(f"data/{d}/{f}.bin", "wb") as fh:
            fh.write(os.urandom(50 * 1024))
"""
_DEEP = """
import os
for _ in range(2000):
    os.mkdir("dd"); os.chdir("dd")
open("bottom", "w").write("deep")
"""


def main() -> None:
    """Print the costs as a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", action="store_true", help="also build and check every built-in task")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="snapgym-store-check-"))
    try:
        with LocalBackend(store_dir=tmp) as backend:
            rows = [_layer_rows(backend, "1,000 files, 50 MB", _FILES)]
            rows.append(_layer_rows(backend, "3 GiB + 1 TB sparse", "truncate -s 3G big; truncate -s 1T huge"))
            rows.append(_layer_rows(backend, "2,000 levels deep", _DEEP))
            if args.tasks:
                rows += _task_rows(backend)
    finally:
        remove_tree(tmp)  # shutil.rmtree recurses, and the deep layer is 2,000 levels deep
    print(f"{'snapshot':34} {'make':>9} {'first use':>10} {'steady':>8} {'later':>7} {'verify':>8}")
    for name, make, first, steady, later, deep in rows:
        print(f"{name:34} {make:9.1f} {first:10.1f} {steady:8.1f} {later:7.3f} {deep:8.1f}")


def _layer_rows(backend: LocalBackend, name: str, script: str) -> tuple[str, float, float, float, float, float]:
    start = backend.build(Template(name="store-check", setup=["true"], workdir="/workspace"))
    makes = []
    for _ in range(3):
        with backend.create(start) as sandbox:
            command = f"python3 - <<'EOF'\n{script}\nEOF" if "import" in script else script
            assert sandbox.exec(command).ok
            made, snap = _timed(sandbox.snapshot)
            makes.append(made)
    return (name, statistics.median(makes), *_checks(backend, snap))


def _task_rows(backend: LocalBackend) -> list[tuple[str, float, float, float, float, float]]:
    from envs.tasks import builtin_tasks

    rows = []
    for task in builtin_tasks():
        try:
            made, snap = _timed(functools.partial(backend.build, task.template))
        except Exception as exc:  # a task this host cannot build is reported, not fatal
            print(f"skipped {task.id}: {str(exc).splitlines()[0][:100]}", file=sys.stderr)
            continue
        rows.append((task.id, made, *_checks(backend, snap)))
    return rows


def _checks(backend: LocalBackend, snap: Snapshot) -> tuple[float, float, float, float]:
    first = _probe(backend, snap)
    steady = [_probe(backend, snap) for _ in range(3)]
    deep, _ = _timed(lambda: backend.verify(snap))
    return first["first_ms"], statistics.median(s["first_ms"] for s in steady), steady[-1]["later_ms"], deep


def _probe(backend: LocalBackend, snap: Snapshot) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(backend.store.root), snap.id], capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def _timed(fn: Callable[[], T]) -> tuple[float, T]:
    started = time.perf_counter()
    value = fn()
    return (time.perf_counter() - started) * 1e3, value


if __name__ == "__main__":
    main()
