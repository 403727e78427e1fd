"""Attribution you cannot game: whatever the agent does to its own sandbox, the episode gets a verdict.

An agent that wants its failures not counted would turn them into "unscored" (retried, never averaged
in). Each sabotage below is tried in both verification modes: the verifier still runs and the episode
is scored 0.0, and after a correct solution plus the same sabotage the episode scores what the outputs
deserve.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

import envs
from pool import LocalBackend
from pool.backends.local.daemon.client import Op
from tests.support.fixtures.envs_fixtures import SOLVE, TASK
from tests.support.needs import skip_missing

SABOTAGE = {
    "destroy /logs": "rm -rf /logs; echo x > /logs; chmod 000 /logs",
    "fill the disk": "dd if=/dev/zero of=/app/fill bs=1M 2>/dev/null; dd if=/dev/zero of=/tmp/fill bs=1M 2>/dev/null",
    "kill init's children": "(setsid sh -c 'sleep 0.2; kill -9 -1' >/dev/null 2>&1 &)",
    "exhaust inodes": 'mkdir -p /tmp/i && cd /tmp/i && python3 -c "\nimport os\ntry:\n    for i in range(10**7):'
    " open(str(i), 'w').close()\nexcept OSError:\n    pass\"",
    "exhaust PIDs": "(setsid sh -c 'b() { b | b & }; b' >/dev/null 2>&1 &); sleep 1",
    "delete the workdir": "cd / && rm -rf /app",
    "break /tmp and /dev": "rm -rf /tmp /dev/shm/* /dev/null; echo x > /tmp; echo junk > /dev/null",
}


@pytest.fixture(scope="module", params=["strict", "shared"])
def env(request: pytest.FixtureRequest, backend: LocalBackend) -> Iterator[envs.ShellEnv]:
    shell = envs.ShellEnv(TASK, backend=backend, verification=request.param, step_timeout_s=20)
    yield shell
    shell.close()


def play(env: envs.ShellEnv, *actions: str) -> dict[str, Any]:
    env.reset()
    for action in actions:
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return {"reward": None, **info}
    _, reward, _, _, info = env.step(envs.SUBMIT)
    return {"reward": reward, **info}


@pytest.mark.parametrize("sabotage", SABOTAGE, ids=list(SABOTAGE))
def test_sabotage_is_scored_not_unscored(env: envs.ShellEnv, sabotage: str) -> None:
    """Sabotage alone: the verifier runs and the episode is a scored 0.0, as the no-op agent's."""
    result = play(env, SABOTAGE[sabotage])
    assert result["scored"] is True, result.get("infra_error")
    assert result["reward"] == 0.0 and "infra_error" not in result


@pytest.mark.parametrize("sabotage", ["destroy /logs", "kill init's children", "exhaust PIDs", "break /tmp and /dev"])
def test_a_solution_survives_sabotage_outside_its_outputs(env: envs.ShellEnv, sabotage: str) -> None:
    """Sabotage next to a correct answer cannot hide it either: the answer is scored 1.0."""
    result = play(env, SOLVE, SABOTAGE[sabotage])
    assert (result["scored"], result["reward"]) == (True, 1.0), result.get("verifier")


def test_an_init_the_agents_memory_use_killed_ends_the_episode_scored(backend: LocalBackend) -> None:
    """If the OOM killer takes the sandbox's init, the agent caused it: scored, not an infrastructure failure.

    The harness makes init the OOM killer's first choice (a score of 1000, which host root may always raise)
    so that the agent's memory bomb kills it; strict verification still scores the outputs.
    """
    if os.geteuid() != 0:
        skip_missing("memory cgroups (and so OOM kills inside the sandbox) need host root")
    shell = envs.ShellEnv(TASK, backend=backend, verification="strict")
    try:
        shell.reset()
        shell.step(SOLVE)
        sandbox = shell.sandbox
        assert sandbox is not None
        init = int(backend.daemon_request(Op.PING, sandbox.number, [])["pid"])  # type: ignore[attr-defined]
        with open(f"/proc/{init}/oom_score_adj", "w") as score:
            score.write("1000")
        hogs = "for i in 1 2 3 4 5 6; do python3 -c 'x = b\"x\" * (100 << 20); import time; time.sleep(3)' & done; wait"
        obs, reward, _, truncated, info = shell.step(hogs)  # none of them is as big as init's score
        assert info["end_reason"] == "out_of_memory" and "ran out of memory" in obs["output"]
        assert (reward, info["scored"], truncated) == (1.0, True, True), info
    finally:
        shell.close()


def test_a_sandbox_whose_files_hold_its_memory_counts_as_out_of_memory(tmp_path: Any) -> None:
    """tmpfs pages are charged to the sandbox's memory: when its files fill it, a command that cannot start
    for lack of memory is the agent's doing (SandboxOutOfMemoryError, then scored), not an infrastructure
    failure; a restore gives the memory back."""
    if os.geteuid() != 0:
        skip_missing("memory cgroups need host root")
    with LocalBackend(store_dir=tmp_path, memory_limit_mb=128, disk_limit_mb=1024) as backend:
        from pool import Template

        snap = backend.build(Template(name="memory-full", setup=["mkdir -p /w"], workdir="/w"))
        with backend.create(snap) as sandbox:
            assert not sandbox.memory_exhausted()  # type: ignore[attr-defined]
            assert sandbox.exec("head -c 120M /dev/zero > /w/fill").exit_code == 0
            assert sandbox.memory_exhausted()  # type: ignore[attr-defined]
            sandbox.restore()
            assert not sandbox.memory_exhausted()  # type: ignore[attr-defined]
