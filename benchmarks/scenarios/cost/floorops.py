"""The floor of an instance: a minimal fresh start in C, beside the same command run without one.

What a sandbox start must cost on this kernel at the least, to set snapgym's
own instances against: ``floor.c`` (beside this file) makes a tmpfs, a child in
new mount, PID, IPC and UTS namespaces that mounts an overlay, binds ``/usr``,
mounts ``/proc`` and a tmpfs ``/dev``, pivots into it and runs ``bash -c true``;
then it exits and the tmpfs goes. That is the part of a local-backend instance
every container runtime does too; a network namespace, cgroups, the seccomp
filter, device nodes, the egress gate and the daemon's round trips are left
out, so a strict episode's two instances cost at least twice the difference
between the two rows (see the cost scenario's results). The same program's
``plain`` mode runs ``bash -c true`` with no new namespace.

The overlay's lower layer is a merged-``/usr`` root made here (``bin``, ``lib``
and ``lib64`` links into ``/usr``, the host's ``/etc/ld.so.cache``), and the
command runs in a sandbox's commands' environment (the no-isolation baseline's ``SANDBOX_COMMAND_ENV``),
so bash loads the same files in both rows as in an episode.

Run as ``python -m benchmarks.scenarios.cost.floorops REPETITIONS`` (root, a C compiler, a
merged-``/usr`` host); prints ``{NAME: {"us_per_op": ..., "kernel_threads_us_per_op": ...}}``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.scenarios.baselines.noisolation import SANDBOX_COMMAND_ENV
from benchmarks.scenarios.cost.kernelops import kernel_threads_s
from benchmarks.scenarios.cost.report import FLOOR_INSTANCE, FLOOR_PLAIN
from pool.backends import csrc

SOURCE = Path(__file__).with_name("floor.c")


class FloorUnavailableError(RuntimeError):
    """The floor cannot be measured on this machine (the message says why)."""


def measure(repetitions: int) -> dict[str, dict[str, float]]:
    """CPU microseconds per repetition of each mode, with the kernel threads' over the same runs."""
    if os.geteuid() != 0:
        raise FloorUnavailableError("the floor mounts and makes namespaces: it needs root")
    if not Path("/usr/bin/bash").exists() or not Path("/bin").resolve() == Path("/usr/bin"):
        raise FloorUnavailableError("the floor's lower layer links /bin into /usr: this host's /usr is not merged")
    with tempfile.TemporaryDirectory(prefix="snapgym-floor-") as scratch:
        binary = _compile(Path(scratch))
        lower, stage = _lower(Path(scratch)), Path(scratch) / "stage"
        stage.mkdir()
        results = {}
        for mode, name in (("instance", FLOOR_INSTANCE), ("plain", FLOOR_PLAIN)):
            kernel_before = kernel_threads_s()
            done = subprocess.run(
                [str(binary), mode, str(repetitions), str(lower), str(stage), "true"],
                capture_output=True, text=True, env=SANDBOX_COMMAND_ENV, check=False, timeout=300,
            )  # fmt: skip
            kernel_s = kernel_threads_s() - kernel_before
            if done.returncode != 0:
                raise FloorUnavailableError(f"the floor's {mode} run failed: {done.stderr.strip()[-300:]}")
            us_per_op = float(done.stdout.split()[0])
            results[name] = {"us_per_op": us_per_op, "kernel_threads_us_per_op": 1e6 * kernel_s / (repetitions + 3)}
        return results


def _compile(scratch: Path) -> Path:
    compiler = csrc.find_compiler()
    if compiler is None:
        raise FloorUnavailableError("no C compiler (cc, gcc or clang) to build the floor with")
    out = scratch / "floor"
    for flags in (["-O2", "-static"], ["-O2"]):  # static, as the sandbox daemon is where it can be
        built = subprocess.run([compiler, *flags, "-o", str(out), str(SOURCE)], capture_output=True, check=False)
        if built.returncode == 0:
            return out
    raise FloorUnavailableError(f"{compiler} could not build {SOURCE.name}")


def _lower(scratch: Path) -> Path:
    """A root with nothing of its own: /usr comes in by a bind mount, the rest are links and empty folders."""
    lower = scratch / "lower"
    for folder in ("usr", "proc", "dev", "tmp", "etc", "root"):
        (lower / folder).mkdir(parents=True)
    for link in ("bin", "sbin", "lib", "lib64"):
        if Path(f"/usr/{link}").exists():
            (lower / link).symlink_to(f"usr/{link}")
    if Path("/etc/ld.so.cache").exists():
        shutil.copy("/etc/ld.so.cache", lower / "etc" / "ld.so.cache")
    return lower


if __name__ == "__main__":
    try:
        print(json.dumps(measure(int(sys.argv[1]))))
    except FloorUnavailableError as error:
        sys.exit(f"floor not measured: {error}")
