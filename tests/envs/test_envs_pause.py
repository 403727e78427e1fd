"""Partial rollouts: an episode paused between steps in one environment (and process) and resumed in
another goes on where it stopped: the same reward, steps numbered on, the same trajectory as an
uninterrupted play. A paused episode is a checkpoint, not a live sandbox, and a handle resumes once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import envs
from envs.episode.pause import PausedEpisode
from pool import ConfigError, LocalBackend, SandboxClosedError, UnsupportedError
from tests.support.backends import BACKEND_OPTIONS, LIMITS
from tests.support.fixtures.envs_fixtures import SOLVE, TASK

ACTIONS = ["cd /app && export PART=one", "echo $PART > part.txt", "cd /tmp", SOLVE, "cat /app/part.txt; pwd"]
"""Working directory, an exported variable and files, all of which must survive the pause."""


def _play(env: envs.ShellEnv, actions: list[str]) -> tuple[list[list[Any]], dict[str, Any]]:
    """[output, step, reward] of each action, and the last step's info."""
    seen, info = [], {}
    for action in actions:
        obs, reward, _, _, info = env.step(action)
        seen.append([obs["output"], info["step"], reward])
    return seen, info


def test_an_episode_paused_in_one_env_finishes_in_another_as_if_never_paused(
    backend: LocalBackend, tmp_path: Path
) -> None:
    whole = envs.ShellEnv(TASK, backend=backend)
    first, second = envs.ShellEnv(TASK, backend=backend), envs.ShellEnv(TASK, backend=backend)
    try:
        whole.reset()
        uninterrupted, whole_end = _play(whole, [*ACTIONS, envs.SUBMIT])
        first.reset()
        before, _ = _play(first, ACTIONS[:2])
        sandbox = first.sandbox
        assert sandbox is not None
        handle = first.pause(carry={"seen": before}, claims_dir=tmp_path)
        assert first.sandbox is None and sandbox.is_closed and first.state is envs.EpisodeState.NEEDS_RESET
        with pytest.raises(SandboxClosedError):  # nobody reaches the paused episode through its old sandbox
            sandbox.exec("touch /app/sneaked")
        with pytest.raises(envs.ResetNeededError):
            first.step("touch /app/sneaked")
        copy = PausedEpisode.from_json(handle.to_json())  # it travels as JSON
        _, info = second.resume(copy)
        assert info["started_at"] == "checkpoint" and info["resumed_at_step"] == 2
        after, end = _play(second, [*ACTIONS[2:], envs.SUBMIT])
        assert copy.carry["seen"] + after == uninterrupted  # outputs, step numbers and the reward
        assert uninterrupted[-1][2] == 1.0 and end["end_reason"] == whole_end["end_reason"] == "submitted"
        assert end["changes"] == whole_end["changes"]  # the whole episode's, not the part after the pause
    finally:
        for env in (whole, first, second):
            env.close()


def test_a_handle_resumes_exactly_once_even_from_another_process(
    backend: LocalBackend, store_dir: Path, tmp_path: Path
) -> None:
    env = envs.ShellEnv(TASK, backend=backend)
    try:
        env.reset()
        env.step("echo hello > /app/hello.txt")
        handle = env.pause(claims_dir=tmp_path)
    finally:
        env.close()
    options = {"store_dir": str(store_dir), **LIMITS, **BACKEND_OPTIONS["local"]}
    script = (
        "import json, sys, envs\n"
        "from envs.episode.pause import PausedEpisode\n"
        "env = envs.ShellEnv(sys.argv[1], backend='local', backend_options=json.loads(sys.argv[2]))\n"
        "_, info = env.resume(PausedEpisode.from_json(sys.argv[3]))\n"
        "obs, reward, term, trunc, end = env.step('cat /app/hello.txt')\n"
        "print(json.dumps([info['resumed_at_step'], obs['output'], end['step']]))\n"
        "env.close()\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, TASK, json.dumps(options), handle.to_json()],
        capture_output=True, text=True, timeout=240, env={**os.environ},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [1, "hello\n[exit code 0]", 2]
    again = envs.ShellEnv(TASK, backend=backend)
    try:
        with pytest.raises(envs.AlreadyResumedError, match=r"resumed already.*exactly once"):
            again.resume(handle)
        with pytest.raises(envs.AlreadyResumedError):
            again.resume(handle.to_dict())
    finally:
        again.close()


def test_pause_refuses_what_it_cannot_hold_and_resume_refuses_what_is_not_a_handle(
    backend: LocalBackend, tmp_path: Path
) -> None:
    python = envs.PythonEnv(TASK, backend=backend)
    shell = envs.ShellEnv(TASK, backend=backend)
    try:
        python.reset()
        with pytest.raises(UnsupportedError, match="in a process"):
            python.pause()
        with pytest.raises(envs.ResetNeededError):
            shell.pause()
        shell.reset()
        with pytest.raises(ConfigError, match="JSON"):
            shell.pause(carry={"x": object()})
        with pytest.raises(ConfigError, match="what pause\\(\\) returned"):
            shell.resume("not a handle")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="not a paused episode's handle"):
            shell.resume({"id": "x"})
        handle: Any = shell.pause(claims_dir=tmp_path)
        other = envs.ShellEnv("top-ips", backend=backend)
        try:
            with pytest.raises(ConfigError, match="not this environment's"):
                other.resume(handle)
        finally:
            other.close()
    finally:
        python.close()
        shell.close()
