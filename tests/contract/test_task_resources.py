"""Task resources and timeouts are the task's: memory, storage and CPUs from task.toml reach every sandbox,
GPUs are refused by a backend without them, the oracle gets the agent timeout, and the action size
limit is the run's to set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import envs
from pool import ConfigError, LocalBackend, Resources
from tests.support.fixtures.envs_fixtures import write_task

ALLOCATE = 'python3 -c \'b = bytearray({mb} << 20); b[::4096] = b"x" * len(b[::4096]); print("held")\''


def _shell(task: Path, backend: LocalBackend) -> envs.ShellEnv:
    env = envs.ShellEnv(task, backend=backend)
    env.reset()
    return env


def test_memory_and_storage_in_task_toml_reach_the_template(tmp_path: Path) -> None:
    """memory = "4G", storage = "512M", cpus = 2: the template carries them as Resources."""
    task = write_task(tmp_path, task_toml='[environment]\nmemory = "4G"\nstorage = "512M"\ncpus = 2\n')
    assert envs.load_task(task).template.resources == Resources(cpus=2.0, memory_mb=4096, storage_mb=512)


def test_a_task_gets_more_memory_than_the_backend_default_when_it_asks(tmp_path: Path, backend: LocalBackend) -> None:
    """The test backend gives 256 MiB; a task asking for 768M holds 400 MiB, one asking for 128M cannot."""
    roomy = _shell(write_task(tmp_path, "roomy", task_toml='[environment]\nmemory = "768M"\n'), backend)
    tight = _shell(write_task(tmp_path, "tight", task_toml="[environment]\nmemory_mb = 128\n"), backend)
    try:
        obs, *_ = roomy.step(ALLOCATE.format(mb=400))
        assert obs["output"].startswith("held"), obs["output"]
        obs, *_ = tight.step(ALLOCATE.format(mb=200))
        assert not obs["output"].startswith("held") and int(obs["exit_code"]) != 0, obs["output"]
    finally:
        roomy.close()
        tight.close()


def test_a_task_storage_limit_bounds_the_sandbox_disk(tmp_path: Path, backend: LocalBackend) -> None:
    """storage = "16M": writing 40 MB into the sandbox fails (the test backend's default is 64 MiB)."""
    env = _shell(write_task(tmp_path, task_toml='[environment]\nstorage = "16M"\n'), backend)
    try:
        obs, *_ = env.step("head -c 40000000 /dev/zero > /app/big")
        assert int(obs["exit_code"]) != 0 and "No space left" in obs["output"]
        obs, *_ = env.step("rm -f /app/big; head -c 8000000 /dev/zero > /app/small && echo fits")
        assert obs["output"].startswith("fits")
    finally:
        env.close()


def test_gpus_load_but_a_backend_without_gpus_refuses_them(tmp_path: Path, backend: LocalBackend) -> None:
    """gpus = 1 is a valid task; the local backend says it has no GPU and which backend has."""
    task = write_task(tmp_path, task_toml='[environment]\ngpus = 1\ngpu_types = ["H100"]\n')
    assert envs.load_task(task).template.resources.gpus == 1
    with pytest.raises(ConfigError, match=r"asks for 1 GPU\(s\) and the 'local' backend has none"):
        envs.ShellEnv(task, backend=backend)


def test_the_action_size_limit_is_an_option(tmp_path: Path, backend: LocalBackend) -> None:
    """A 100 KiB action is refused at the default 64 KiB and runs when the limit is raised."""
    task = write_task(tmp_path)
    action = "true # " + "x" * 100_000
    small = envs.ShellEnv(task, backend=backend)
    large = envs.ShellEnv(task, backend=backend, max_action_bytes=256 * 1024)
    try:
        small.reset()
        with pytest.raises(envs.InvalidActionError, match="bytes"):
            small.step(action)
        large.reset()
        obs, *_ = large.step(action)
        assert int(obs["exit_code"]) == 0
    finally:
        small.close()
        large.close()


def test_the_oracle_runs_under_the_agent_timeout_not_the_step_timeout(tmp_path: Path) -> None:
    """With step_timeout_s=1, a solve.sh of 3 s still scores 1.0: the oracle's one step gets [agent] timeout_sec."""
    suite = tmp_path / "suite"
    write_task(suite, "slow", task_toml="[agent]\ntimeout_sec = 60\n", solution="sleep 3; touch /app/done\n")
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "suite=dir", f"suite.path={suite}", "step_timeout_s=1",
         "progress=false", "benchmark.plots=false", f"backend.store_dir={tmp_path / 'store'}",
         f"output_dir={run_dir}", f"hydra.run.dir={tmp_path / 'hydra'}"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["by_task"]["slow"]["mean_reward"] == 1.0, summary["by_task"]
