"""Branching: checkpoint mid-episode, reset back to it, and fork independent environments from it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import envs
from pool import ConfigError, LocalBackend, Snapshot
from tests.support.fixtures.envs_fixtures import SOLVE, TASK


@pytest.fixture(scope="module")
def shell(backend: LocalBackend) -> Iterator[envs.ShellEnv]:
    env = envs.ShellEnv(TASK, backend=backend)
    yield env
    env.close()


def out(env: envs.SandboxEnv, command: str) -> str:
    """The output of a step that must not end the episode."""
    obs, _, terminated, truncated, _ = env.step(command)
    assert not (terminated or truncated)
    return str(obs["output"])


def test_reset_to_a_checkpoint_brings_back_its_files(shell: envs.ShellEnv) -> None:
    """Files at checkpoint time come back on reset(options={"snapshot": snap}), with the snapshot's digest."""
    _, start = shell.reset()
    out(shell, "echo v1 > /app/state.txt; mkdir -p /app/dir && echo deep > /app/dir/f")
    snap = shell.checkpoint()
    assert isinstance(snap, Snapshot) and snap.digest != start["start_digest"]
    out(shell, "echo v2 > /app/state.txt; rm -r /app/dir; touch /app/extra")
    _, info = shell.reset(options={"snapshot": snap})
    assert info["start_digest"] == snap.digest
    assert info["snapshot_id"] == snap.id
    assert out(shell, "cat /app/state.txt /app/dir/f; ls /app") == "v1\ndeep\naccess.log\ndir\nstate.txt\n[exit code 0]"
    _, again = shell.reset(options={"snapshot": snap})
    assert again["start_digest"] == snap.digest
    _, plain = shell.reset()
    assert plain["start_digest"] == start["start_digest"]
    assert "No such file" in out(shell, "cat /app/state.txt")


def test_an_episode_from_a_checkpoint_is_scored_on_its_own_end_state(shell: envs.ShellEnv) -> None:
    """A checkpoint taken after solving scores 1.0 when submitted from it; the task start still scores 0.0."""
    shell.reset()
    out(shell, SOLVE)
    solved = shell.checkpoint()
    shell.reset(options={"snapshot": solved})
    assert shell.step(envs.SUBMIT)[1] == 1.0
    shell.reset()
    assert shell.step(envs.SUBMIT)[1] == 0.0


def test_forked_children_start_at_the_checkpoint_and_are_independent(shell: envs.ShellEnv) -> None:
    """fork(3, snap) gives three environments at the checkpoint; what one writes the others never see."""
    shell.reset()
    out(shell, "echo branch-point > /app/state.txt")
    snap = shell.checkpoint()
    children = shell.fork(3, snap)
    try:
        assert len(children) == 3
        assert len({id(child) for child in children} | {id(shell)}) == 4
        for index, child in enumerate(children):
            assert isinstance(child, envs.ShellEnv) and child.backend is shell.backend
            _, info = child.reset(options={"snapshot": snap})
            assert info["start_digest"] == snap.digest
            assert out(child, "cat /app/state.txt") == "branch-point\n[exit code 0]"
            out(child, f"echo child-{index} > /app/mine.txt")
        for index, child in enumerate(children):
            assert out(child, "cat /app/mine.txt; ls /app") == (
                f"child-{index}\naccess.log\nmine.txt\nstate.txt\n[exit code 0]"
            )
        assert "No such file" in out(shell, "cat /app/mine.txt")
        sandboxes = [child.sandbox for child in children]
        assert len({id(s) for s in sandboxes}) == 3
    finally:
        for child in children:
            child.close()
    assert all(child.state is envs.EpisodeState.CLOSED for child in children)
    assert out(shell, "cat /app/state.txt") == "branch-point\n[exit code 0]"


def test_fork_without_a_snapshot_checkpoints_the_current_state(shell: envs.ShellEnv) -> None:
    """fork(n) with no snapshot starts the children from the parent's state right now."""
    shell.reset()
    out(shell, "echo now > /app/now.txt")
    (child,) = shell.fork(1)
    try:
        _, info = child.reset()  # a child starts at the fork point, and says so
        assert out(child, "cat /app/now.txt") == "now\n[exit code 0]"
        assert info["start_digest"] != shell.task_snapshot.digest and info["started_at"] == "fork"
        assert child.fork_point is not None and info["snapshot_id"] == child.fork_point.id
        out(child, "rm /app/now.txt")
        _, again = child.reset()  # every plain reset: the fork point, not the task's start
        assert out(child, "cat /app/now.txt") == "now\n[exit code 0]" and again["started_at"] == "fork"
        _, task = child.reset(options={"snapshot": child.task_snapshot})
        assert "No such file" in out(child, "cat /app/now.txt") and task["started_at"] == "snapshot"
        _, parent = shell.reset()
        assert parent["started_at"] == "task"
    finally:
        child.close()


def test_fork_children_can_finish_their_episodes_separately(shell: envs.ShellEnv) -> None:
    """One child solves and scores 1.0 while its sibling, from the same point, scores 0.0."""
    shell.reset()
    snap = shell.checkpoint()
    good, bad = shell.fork(2, snap)
    try:
        good.reset(options={"snapshot": snap})
        bad.reset(options={"snapshot": snap})
        out(good, SOLVE)
        out(bad, "echo 0 > /app/answer.txt")
        assert good.step(envs.SUBMIT)[1:3] == (1.0, True)
        assert bad.step(envs.SUBMIT)[1:3] == (0.0, True)
    finally:
        good.close()
        bad.close()


def test_python_checkpoints_keep_files_not_variables(backend: LocalBackend) -> None:
    """A Python-v0 checkpoint holds the files; the interpreter starts fresh from it, in parent and children."""
    env = envs.PythonEnv(TASK, backend=backend)
    try:
        env.reset()
        out(env, "secret = 1\nopen('/app/note.txt', 'w').write('kept')")
        snap = env.checkpoint()
        env.reset(options={"snapshot": snap})
        assert out(env, "open('/app/note.txt').read()") == "'kept'\n[exit code 0]"
        assert "NameError" in out(env, "secret")
        (child,) = env.fork(1, snap)
        try:
            child.reset(options={"snapshot": snap})
            assert out(child, "open('/app/note.txt').read()") == "'kept'\n[exit code 0]"
            assert out(child, "x = 2\nx * 21") == "42\n[exit code 0]"
        finally:
            child.close()
    finally:
        env.close()


def test_bad_reset_options_and_fork_arguments_are_errors(shell: envs.ShellEnv) -> None:
    """An unknown reset option or a non-Snapshot raises ConfigError; fork(0) too; checkpoint needs an episode."""
    known = r"known: \['resume_at', 'snapshot', 'task'\]"
    with pytest.raises(ConfigError, match=r"unknown reset option.*'snapshto'.*" + known):
        shell.reset(options={"snapshto": None})
    with pytest.raises(ConfigError, match="must be a Snapshot"):
        shell.reset(options={"snapshot": "abc123"})
    shell.reset()
    with pytest.raises(ConfigError, match="n >= 1"):
        shell.fork(0)
    fresh = envs.ShellEnv(TASK, backend=shell.backend)
    try:
        with pytest.raises(envs.ResetNeededError):
            fresh.checkpoint()
    finally:
        fresh.close()
    shell.step(envs.SUBMIT)
    with pytest.raises(envs.ResetNeededError):
        shell.checkpoint()
