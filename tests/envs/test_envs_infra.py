"""Infrastructure failures end the episode unscored, never as a score of 0, and the next reset recovers.

What the agent can cause is a score: a verifier that ran and left no usable reward, or timed out, scores 0.0
(envs.tasks.verifier's attribution rule), so sabotage cannot turn a failure into "unscored".
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import envs
from pool import LocalBackend
from pool.backends.local.daemon.client import Op
from tests.support.fixtures.envs_fixtures import SOLVE, TASK, write_task


@pytest.fixture(scope="module")
def env(backend: LocalBackend) -> Iterator[envs.ShellEnv]:
    shell = envs.ShellEnv(TASK, backend=backend)
    yield shell
    shell.close()


def kill_init_from_the_host(env: envs.SandboxEnv) -> None:
    """SIGKILL the sandbox's init (and so every process in it) from outside the sandbox."""
    sandbox = env.sandbox
    assert sandbox is not None
    backend = env.backend
    assert isinstance(backend, LocalBackend)
    pid = int(backend.daemon_request(Op.PING, sandbox.number, [])["pid"])  # type: ignore[attr-defined]
    assert pid > 0
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10  # wait for the daemon to see the death; not a timing assertion
    while sandbox.is_alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not sandbox.is_alive


def close_under_the_env(env: envs.SandboxEnv) -> None:
    """Close the sandbox behind the environment's back."""
    assert env.sandbox is not None
    env.sandbox.close()


def assert_unscored(result: tuple[dict[str, Any], float, bool, bool, dict[str, Any]]) -> dict[str, Any]:
    """The episode ended for infrastructure reasons: truncated, unscored, an error, reward 0.0."""
    _, reward, terminated, truncated, info = result
    assert (reward, terminated, truncated) == (0.0, False, True), info
    assert info["scored"] is False
    assert isinstance(info["infra_error"], str) and info["infra_error"]
    return info


@pytest.mark.parametrize("break_it", [kill_init_from_the_host, close_under_the_env], ids=["killed", "closed"])
def test_a_dead_sandbox_ends_the_episode_unscored_and_reset_recovers(
    env: envs.ShellEnv, break_it: Callable[[envs.SandboxEnv], None]
) -> None:
    """Stepping into a dead sandbox truncates the episode with infra_error; reset() gives a working one."""
    _, first = env.reset()
    env.step("echo mid-episode > /app/progress")
    break_it(env)
    obs, *_ = result = env.step("echo hello")
    info = assert_unscored(result)
    assert int(obs["exit_code"]) == envs.NO_COMMAND and "infrastructure failure" in obs["output"]
    assert info["end_reason"] == "infra_error"
    assert "Sandbox" in info["infra_error"]
    with pytest.raises(envs.ResetNeededError):
        env.step("echo again")
    _, second = env.reset()
    assert second["start_digest"] == first["start_digest"]
    obs, reward, terminated, truncated, _ = env.step("echo back; ls /app")
    assert obs["output"] == "back\naccess.log\n[exit code 0]"
    assert (reward, terminated, truncated) == (0.0, False, False)
    env.step(SOLVE)
    _, reward, terminated, _, info = env.step(envs.SUBMIT)
    assert (reward, terminated, info["scored"]) == (1.0, True, True)


def test_a_sandbox_dead_at_submit_is_unscored(env: envs.ShellEnv) -> None:
    """If the sandbox dies before the verifier runs, the verdict is missing, not 0."""
    env.reset()
    env.step(SOLVE)
    kill_init_from_the_host(env)
    info = assert_unscored(env.step(envs.SUBMIT))
    assert info["infra_error"].startswith("verifier:")
    assert info["verifier"]["reward"] is None and info["verifier"]["error"]
    env.reset()
    assert env.step("echo ok")[0]["output"] == "ok\n[exit code 0]"


def test_a_sandbox_closed_before_reset_is_replaced(env: envs.ShellEnv) -> None:
    """reset() after the sandbox was closed under the env creates a new sandbox."""
    env.reset()
    old = env.sandbox
    close_under_the_env(env)
    env.reset()
    assert env.sandbox is not None and env.sandbox is not old and env.sandbox.is_alive
    assert env.step("echo fresh")[0]["output"] == "fresh\n[exit code 0]"


@pytest.mark.parametrize(
    ("test_sh", "error"),
    [
        ("#!/bin/bash\necho 'I forgot the reward'\n", "neither"),
        ("#!/bin/bash\nmkdir -p /logs/verifier\necho maybe > /logs/verifier/reward.txt\n", "number"),
        ("#!/bin/bash\nmkdir -p /logs/verifier\necho nan > /logs/verifier/reward.txt\n", "non-finite"),
        ("#!/bin/bash\nmkdir -p /logs/verifier\necho '{\"score\": 1}' > /logs/verifier/reward.json\n", "'reward'"),
        ("#!/bin/bash\nmkdir -p /logs/verifier\necho '{bad json' > /logs/verifier/reward.json\n", "not JSON"),
    ],
    ids=["no-reward", "not-a-number", "nan", "json-without-reward", "bad-json"],
)
def test_a_verifier_without_a_usable_reward_scores_zero(
    backend: LocalBackend, tmp_path: Path, test_sh: str, error: str
) -> None:
    """A test.sh that ran and wrote no (usable) reward scores 0.0 and says why: the agent's outputs drove it."""
    shell = envs.ShellEnv(write_task(tmp_path, test_sh=test_sh), backend=backend)
    try:
        shell.reset()
        _, reward, terminated, truncated, info = shell.step(envs.SUBMIT)
        assert (reward, terminated, truncated, info["scored"]) == (0.0, True, False, True)
        assert info["end_reason"] == "submitted" and "infra_error" not in info
        assert info["verifier"]["reward"] == 0.0
        assert error in info["verifier"]["error"] and "scored 0.0" in info["verifier"]["error"]
    finally:
        shell.close()


def test_a_verifier_timeout_scores_zero_even_after_writing_a_reward(backend: LocalBackend, tmp_path: Path) -> None:
    """A test.sh that runs past [verifier].timeout_sec scores 0.0, even if it wrote a reward of 1 before."""
    test_sh = "#!/bin/bash\nmkdir -p /logs/verifier\necho 1 > /logs/verifier/reward.txt\nsleep 60\n"
    task = write_task(tmp_path, test_sh=test_sh, task_toml='version = "1.0"\n[verifier]\ntimeout_sec = 0.5\n')
    shell = envs.ShellEnv(task, backend=backend)
    try:
        shell.reset()
        _, reward, _, _, info = shell.step(envs.SUBMIT)
        assert (reward, info["scored"]) == (0.0, True)
        assert info["verifier"]["timed_out"] is True and "timed out" in info["verifier"]["error"]
    finally:
        shell.close()


def test_the_step_limit_with_a_broken_verifier_scores_zero(backend: LocalBackend, tmp_path: Path) -> None:
    """Truncation by max_steps with a verifier that writes nothing is a scored 0.0 as well."""
    shell = envs.ShellEnv(write_task(tmp_path, test_sh="#!/bin/bash\ntrue\n"), backend=backend, max_steps=1)
    try:
        shell.reset()
        _, reward, terminated, truncated, info = shell.step("touch /app/done")
        assert (reward, terminated, truncated, info["scored"]) == (0.0, False, True, True)
        assert info["end_reason"] == "max_steps"
    finally:
        shell.close()
