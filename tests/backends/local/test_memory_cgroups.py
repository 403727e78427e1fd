"""Served episodes do not pile up memory cgroups on the host (issue 34 item 5).

A removed memory cgroup lives on, dying, while page cache is charged to it, and
the kernel's per-cgroup bookkeeping of the dying ones slows every later
cgroup and namespace operation. Each instance gets memory cgroups of its own
(one for the agent's, one for the strict verifier's), so a backend that left
them dying would add about two per episode.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import gymnasium as gym

import envs
from benchmarks.scenarios.cost.segments import memory_cgroups
from pool import LocalBackend
from tests.support.needs import skip_missing

TRIVIAL = Path(__file__).resolve().parents[3] / "benchmarks" / "tasks" / "trivial"
EPISODES = 200
SLACK = 30
"""The host's count moves with every other tenant's containers and sandboxes too."""


def test_two_hundred_episodes_leave_memory_cgroups_within_a_small_multiple_of_the_live_ones(tmp_path: Path) -> None:
    if os.geteuid() != 0 or memory_cgroups() == 0:
        skip_missing("needs root and a memory cgroup controller")
    backend = LocalBackend(store_dir=tmp_path / "store", runtime_dir=tmp_path / "run")
    env = gym.make("snapgym/Shell-v0", task=str(TRIVIAL), backend=backend, max_steps=3)
    try:
        env.reset()
        before = memory_cgroups()
        for _ in range(EPISODES):
            env.reset()
            env.step("echo ok > /app/answer.txt")
            _, reward, *_ = env.step(envs.SUBMIT)
            assert reward == 1.0
        time.sleep(1.0)  # the janitor removes the last instances' cgroups off the request path
        added = memory_cgroups() - before
    finally:
        env.close()
        backend.close()
    live = 3  # the sandbox's current instance, its spare and the verifier's
    assert added <= 4 * live + SLACK, f"{EPISODES} episodes added {added} memory cgroups (live or dying)"
