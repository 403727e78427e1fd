"""Environments on a SandboxPool: resets lease warm sandboxes, branching works, a dead host is an infra failure."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import ray

import envs
from pool import SandboxPool
from tests.support.fixtures.pool_fixtures import host_pid, process_args, wait_until

pytest_plugins = ["tests.support.fixtures.pool_fixtures"]

SOLVE = "awk '$9 ~ /^5/ {n++} END {print n+0}' access.log > answer.txt"


def test_episodes_on_a_pool_start_identically_and_score(shared_pool: SandboxPool) -> None:
    """Each reset leases a sandbox at the task's snapshot; nothing leaks between episodes; the verifier scores."""
    env = gym.make("snapgym/Shell-v0", task="log-error-count", pool=shared_pool)
    try:
        _, first = env.reset()
        env.step("echo leak > /app/leak.txt")
        _, second = env.reset()
        assert first["backend"] == "pool" and first["start_digest"] == second["start_digest"]
        obs, *_ = env.step("ls /app")
        assert obs["output"] == "access.log\n[exit code 0]"
        env.step("curl -sS -m 5 https://pypi.org/ || true")  # the task is offline: refused, and on record
        env.step(SOLVE)
        _, reward, terminated, _, info = env.step(envs.SUBMIT)
        assert (reward, terminated, info["scored"]) == (1.0, True, True)
        # the policy and the audit travel through the lease (the sandbox is on a pool host)
        attempts = [(c["host"], c["verdict"], c["rule"]) for c in info["network"]["connections"]]
        assert attempts == [("pypi.org", "denied", "no-network")]
        assert info["changes"]["added"] == ["/app/answer.txt"]  # the end-state diff travels too
    finally:
        env.close()


def test_checkpoint_and_fork_on_a_pool(shared_pool: SandboxPool) -> None:
    """A checkpoint restores in place, and fork gives independent children at the checkpoint."""
    env = envs.ShellEnv("log-error-count", pool=shared_pool)
    try:
        env.reset()
        env.step("echo 1 > /app/mark")
        snap = env.checkpoint()
        env.step("rm /app/mark")
        _, info = env.reset(options={"snapshot": snap})
        assert info["start_digest"] == snap.digest
        assert env.step("cat /app/mark")[0]["output"] == "1\n[exit code 0]"
        children = env.fork(2, snap)
        try:
            for child in children:
                child.reset(options={"snapshot": snap})
            children[0].step("echo only-here > /app/only")
            assert children[1].step("test -e /app/only; echo $?")[0]["output"] == "1\n[exit code 0]"
            assert children[1].step("cat /app/mark")[0]["output"] == "1\n[exit code 0]"
        finally:
            for child in children:
                child.close()
    finally:
        env.close()


def test_a_dead_host_ends_the_episode_as_an_infra_failure(make_pool: Callable[..., SandboxPool]) -> None:
    """Killing the host actor mid-episode truncates the episode unscored; the next reset gets a new sandbox."""
    pool = make_pool(min_warm=1, max_warm=2, max_size=4)
    env = envs.ShellEnv("log-error-count", pool=pool)
    try:
        env.reset()
        lease = env.sandbox
        pid = host_pid(lease)  # type: ignore[arg-type]
        ray.kill(lease._host, no_restart=True)  # type: ignore[union-attr]
        wait_until(lambda: process_args(pid) is None, "the host actor's process to exit")
        _, reward, terminated, truncated, info = env.step("ls")
        assert (reward, terminated, truncated, info["scored"]) == (0.0, False, True, False)
        assert info["infra_error"].startswith(("LeaseLostError", "SandboxCrashedError")), info["infra_error"]
        _, info = env.reset()
        assert env.step("ls /app")[0]["output"] == "access.log\n[exit code 0]"
    finally:
        env.close()


def test_vector_env_on_a_pool(shared_pool: SandboxPool) -> None:
    """make_vec passes the pool to every sub-environment; all start from the same digest."""
    vec = gym.make_vec("snapgym/Shell-v0", num_envs=3, task="log-error-count", pool=shared_pool)
    try:
        _, infos = vec.reset(seed=0)
        assert len(set(infos["start_digest"])) == 1
        obs, *_ = vec.step(("echo a", "echo b", "echo c"))
        assert list(obs["output"]) == ["a\n[exit code 0]", "b\n[exit code 0]", "c\n[exit code 0]"]
    finally:
        vec.close()
