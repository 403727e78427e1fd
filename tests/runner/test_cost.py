"""benchmark=cost: CPU by process kind from /proc, checked against real processes, and the scenario's smoke run."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.scenarios.cost import gateops
from benchmarks.scenarios.cost.accounting import ProcessTable, ProcessTimes, by_kind
from benchmarks.scenarios.cost.report import FLOOR_INSTANCE, FLOOR_PLAIN
from benchmarks.scenarios.cost.segments import Sample, Sampled, steady_state

REPO = Path(__file__).resolve().parents[2]
BURN = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"


def _burn(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", BURN.format(s=seconds)])


def test_a_child_that_ends_in_the_window_is_counted_once() -> None:
    """Seen alive by a sample and then reaped: its own time and the runner's reaped time are not both counted."""
    start = ProcessTable.now()
    child = _burn(0.4)
    time.sleep(0.2)
    middle = ProcessTable.now()
    assert any(times.kind == "runner children" for times in middle.processes.values())
    child.wait()
    seconds = by_kind([start, middle, ProcessTable.now()])["runner children"].total_s
    assert 0.35 <= seconds < 0.8  # 0.4 s of CPU plus the interpreter's start (more on a busy machine), never twice


def test_only_the_windows_share_of_a_longer_process_is_counted() -> None:
    child = _burn(0.6)
    try:
        time.sleep(0.35)
        start = ProcessTable.now()
        time.sleep(0.1)
        end = ProcessTable.now()
    finally:
        child.wait()
    seconds = by_kind([start, end])["runner children"].total_s
    assert seconds <= 0.25  # the 0.1 s window (plus tick rounding; a busy machine may give it none), not the 0.35 s


def _runner_at(cpu_s: float) -> ProcessTable:
    return ProcessTable({(1, 1): ProcessTimes(1, 0, 1, "runner", cpu_s, 0.0, 0.0, 0.0)})


def test_the_steady_state_leaves_out_what_a_run_costs_once() -> None:
    """2 s of CPU before the first episode and 3 s after the last (a pool started, a report written), 0.1 s per
    episode in between: the steady state is 0.1 s per episode; the whole run is not."""
    episodes = [(10.0 + i, 10.9 + i) for i in range(10)]  # one ends every second, from 10.9 to 19.9
    cpu = {float(t): 0.2 * min(t, 10) + 0.1 * max(0, min(t, 20) - 10) + (3.0 if t > 20 else 0.0) for t in range(24)}
    samples = [Sample(at, busy_s=cpu[at], table=_runner_at(cpu[at])) for at in sorted(cpu)]
    sampled = Sampled(samples, sampler_cpu_s=0.0, wall_s=23.0, cgroups=(0, 0))
    steady = steady_state("steady", sampled, episodes)
    assert steady is not None
    assert steady.ms_by_kind["runner"] == pytest.approx(100.0)  # 0.9 s over the 9 episodes that ended in 10..19
    assert sampled.cost("whole", 10).ms_by_kind["runner"] == pytest.approx(100.0 + 500.0)
    assert steady_state("steady", sampled, []) is None
    assert steady_state("steady", sampled, [(10.2, 10.8)]) is None  # no two samples inside


def test_the_cost_scenario_reports_phases_segments_and_kernel_operations(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "benchmark=cost", "benchmark.episodes=4", "benchmark.rounds=2",
         "benchmark.kernel_op_repetitions=3", "pool.size=2", f"hydra.run.dir={out}"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["segments"]) == {
        "reset",
        "reset+steps",
        "reset+steps+seal",
        "episode (env)",
        "episode (runner)",
        "episode (runner, steady)",
        "baseline",
    }
    assert len(summary["phases"]) == 6 and len(summary["rounds"]) == 2
    runner = summary["segments"]["episode (runner)"]
    assert runner["own"] > 0 and runner["runner"] > 0
    # A sandbox's programs are seen in some segment (in a run of four episodes one segment may catch none of them,
    # as in one CI run; the baseline runs no sandbox).
    sandboxed = max(segment["instances"] for name, segment in summary["segments"].items() if name != "baseline")
    assert sandboxed > 0 and summary["segments"]["baseline"]["instances"] < sandboxed
    assert summary["ratio_to_baseline"]["own"] == pytest.approx(runner["own"] / summary["segments"]["baseline"]["own"])
    assert "Linux" in summary["machine"]
    assert (out / "cost.md").read_text().startswith("Machine: ")
    if summary["kernel_ops_us"]:  # root only
        assert {"memory cgroup", "network namespace", "tmpfs+overlay", gateops.NAME} <= set(summary["kernel_ops_us"])
        assert summary["kernel_ops_us"][gateops.NAME]["us_per_op"] > 0
        floor = summary["kernel_ops_us"][FLOOR_INSTANCE], summary["kernel_ops_us"][FLOOR_PLAIN]
        assert floor[0]["us_per_op"] > floor[1]["us_per_op"] > 0  # the same bash, with and without an instance
        # The floor's episode adds the instance's machine-wide kernel threads, which a run of three operations
        # cannot tell from other work (one CI run measured a negative share): the arithmetic is checked here.
        at_floor, baseline_own = summary["floor"], summary["segments"]["baseline"]["own"]
        assert at_floor["episode_ms"] == pytest.approx(baseline_own + 2 * at_floor["instance_ms"])
        assert "A strict episode at the floor" in (out / "cost.md").read_text()


def test_another_tenants_keeper_is_not_counted(tmp_path: Path) -> None:
    """A process titled like a keeper that the runner did not start (reparented away) is ``other``."""
    pid_file = tmp_path / "pid"
    script = f"import os,time\nopen({str(pid_file)!r},'w').write(str(os.getpid()))\n" + BURN.format(s=0.5)
    # bash -c '... &' exits at once: the burner is reparented away from the runner, as another tenant's is
    subprocess.run(["bash", "-c", f"exec -a snapgym-keeper {sys.executable} -c {shlex.quote(script)} &"], check=True)
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.02)
    start = ProcessTable.now()
    time.sleep(0.3)
    kinds = by_kind([start, ProcessTable.now()])
    assert any(times.pid == int(pid_file.read_text()) and times.kind == "other" for times in start.processes.values())
    # The burner's 0.3 s of CPU is not among the keepers' (the idle keepers of this test process's own
    # backends, when other tests of the session started some, may be listed, with next to nothing).
    keepers = kinds.get("keepers")
    assert keepers is None or keepers.user_s + keepers.system_s < 0.1, keepers


def test_a_ray_pool_is_refused_by_the_cost_scenario(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "benchmark=cost", "pool=ray", f"hydra.run.dir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "run it with pool=direct" in done.stderr
