"""Bad input: calls out of order, actions of the wrong type or size, unknown tasks, bad options.

Each is a clear error from one tree (and Gymnasium's), and none of them changes the sandbox or the step count.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import gymnasium.error
import pytest

import envs
from pool import ConfigError, LocalBackend, SnapgymError
from tests.support.fixtures.envs_fixtures import TASK


@pytest.fixture(scope="module")
def shell(backend: LocalBackend) -> Iterator[envs.ShellEnv]:
    env = envs.ShellEnv(TASK, backend=backend, max_action_bytes=64 * 1024)
    yield env
    env.close()


def test_step_before_reset_needs_a_reset(backend: LocalBackend) -> None:
    """step() before the first reset() raises ResetNeededError, also Gymnasium's ResetNeeded."""
    env = envs.ShellEnv(TASK, backend=backend)
    try:
        with pytest.raises(envs.ResetNeededError, match="reset") as raised:
            env.step("ls")
        assert isinstance(raised.value, gymnasium.error.ResetNeeded)
        assert isinstance(raised.value, SnapgymError)
        assert env.sandbox is None
    finally:
        env.close()


def test_step_before_reset_through_gym_make(backend: LocalBackend) -> None:
    """Through gym.make the same mistake raises Gymnasium's ResetNeeded (from its order-enforcing wrapper)."""
    env = gym.make("snapgym/Shell-v0", task=TASK, backend=backend)
    try:
        with pytest.raises(gymnasium.error.ResetNeeded):
            env.step("ls")
    finally:
        env.close()


@pytest.mark.parametrize("ending", [envs.SUBMIT, "max_steps"])
def test_step_after_the_episode_ended_needs_a_reset(backend: LocalBackend, ending: str) -> None:
    """After a submit or the step limit, step() raises ResetNeededError until the next reset()."""
    env = envs.ShellEnv(TASK, backend=backend, max_steps=1)
    try:
        env.reset()
        _, _, terminated, truncated, _ = env.step(envs.SUBMIT if ending == envs.SUBMIT else "true")
        assert terminated or truncated
        assert env.state is envs.EpisodeState.ENDED
        with pytest.raises(envs.ResetNeededError, match="ended"):
            env.step("ls")
        with pytest.raises(envs.ResetNeededError):
            env.step(envs.SUBMIT)
        env.reset()
        assert env.state is envs.EpisodeState.RUNNING
    finally:
        env.close()


@pytest.mark.parametrize("action", [1, b"ls", None, ["ls"], 1.5], ids=["int", "bytes", "None", "list", "float"])
def test_a_non_str_action_is_invalid_and_changes_nothing(shell: envs.ShellEnv, action: Any) -> None:
    """A non-str action raises InvalidActionError (Gymnasium InvalidAction, ValueError); the step is not counted."""
    shell.reset()
    shell.step("true")
    with pytest.raises(envs.InvalidActionError, match="must be a str") as raised:
        shell.step(action)
    assert isinstance(raised.value, gymnasium.error.InvalidAction)
    assert isinstance(raised.value, ValueError)
    assert shell.steps == 1 and shell.state is envs.EpisodeState.RUNNING


def test_an_oversized_action_is_invalid_and_leaves_the_sandbox_alone(shell: envs.ShellEnv) -> None:
    """A 2 MB action raises InvalidActionError naming the limit; the file written before is intact."""
    shell.reset()
    shell.step("echo before > /app/keep.txt")
    huge = "echo after > /app/keep.txt; touch /app/huge-ran #" + "a" * (2 * 1024 * 1024)
    with pytest.raises(envs.InvalidActionError, match="max_action_bytes=65536"):
        shell.step(huge)
    assert shell.steps == 1 and shell.state is envs.EpisodeState.RUNNING
    obs, _, _, _, info = shell.step("cat /app/keep.txt; ls /app")
    assert obs["output"] == "before\naccess.log\nkeep.txt\n[exit code 0]"
    assert info["step"] == 2


def test_the_action_limit_counts_utf8_bytes(backend: LocalBackend) -> None:
    """An action at max_action_bytes runs; one byte more, or fewer characters that encode longer, is refused."""
    env = envs.ShellEnv(TASK, backend=backend, max_action_bytes=100)
    try:
        env.reset()
        exact = "echo ok #".ljust(100, "x")
        obs, *_ = env.step(exact)
        assert obs["output"] == "ok\n[exit code 0]"
        with pytest.raises(envs.InvalidActionError, match="101 bytes"):
            env.step(exact + "x")
        with pytest.raises(envs.InvalidActionError, match="102 bytes"):
            env.step("é" * 51)  # 51 characters, 102 bytes
        assert env.steps == 1
        assert not env.action_space.contains("x" * 101)
    finally:
        env.close()


def test_a_nul_in_the_action_is_invalid(shell: envs.ShellEnv) -> None:
    """A NUL character cannot reach bash: InvalidActionError, nothing runs, nothing is counted."""
    shell.reset()
    with pytest.raises(envs.InvalidActionError, match="NUL"):
        shell.step("touch /app/nul-ran\0; echo x")
    assert shell.steps == 0
    assert not shell.action_space.contains("a\0b")
    obs, *_ = shell.step("ls /app")
    assert obs["output"] == "access.log\n[exit code 0]"


def test_an_unencodable_action_is_invalid(shell: envs.ShellEnv) -> None:
    """A str that is not valid Unicode text (a lone surrogate) is an InvalidActionError, not a crash."""
    shell.reset()
    with pytest.raises(envs.InvalidActionError):
        shell.step("echo \ud800")
    assert shell.steps == 0


def test_an_unknown_task_at_gym_make(backend: LocalBackend) -> None:
    """gym.make with an unknown task id raises TaskNotFoundError with a suggestion."""
    with pytest.raises(envs.TaskNotFoundError, match="did you mean log-error-count"):
        gym.make("snapgym/Shell-v0", task="log-error-cnt", backend=backend)
    with pytest.raises(envs.TaskNotFoundError):
        gym.make("snapgym/Python-v0", task="/no/such/task/dir", backend=backend)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_steps": 0}, "must be positive"),
        ({"step_timeout_s": 0}, "must be positive"),
        ({"max_action_bytes": -1}, "must be positive"),
        ({"max_output_bytes": 0}, "must be positive"),
        ({"render_mode": "human"}, "render_mode"),
    ],
)
def test_bad_environment_options_are_config_errors(backend: LocalBackend, kwargs: dict[str, Any], match: str) -> None:
    """Non-positive limits and an unsupported render mode raise ConfigError (a ValueError)."""
    with pytest.raises(ConfigError, match=match):
        envs.ShellEnv(TASK, backend=backend, **kwargs)


def test_reset_and_step_after_close_are_errors(backend: LocalBackend) -> None:
    """A closed environment refuses reset() and step() with ResetNeededError saying it is closed."""
    env = envs.ShellEnv(TASK, backend=backend)
    env.reset()
    env.close()
    with pytest.raises(envs.ResetNeededError, match="closed"):
        env.reset()
    with pytest.raises(envs.ResetNeededError, match="closed"):
        env.step("ls")


def test_a_command_with_bad_output_bytes_is_still_an_observation(shell: envs.ShellEnv) -> None:
    """Binary and invalid UTF-8 output decode with replacement characters instead of failing."""
    shell.reset()
    obs, *_ = shell.step("printf '\\377\\376abc'; printf '\\351t\\351' >&2")
    assert int(obs["exit_code"]) == 0
    assert obs["output"] == "\ufffd\ufffdabc\n[stderr]\n\ufffdt\ufffd\n[exit code 0]"
    assert shell.observation_space.contains(obs)


def test_an_observation_with_a_nul_byte_is_in_the_observation_space(shell: envs.ShellEnv) -> None:
    """Every observation, even of a command that prints NUL bytes, is in the observation space."""
    shell.reset()
    obs, *_ = shell.step("printf 'a\\000b'")
    assert int(obs["exit_code"]) == 0
    assert shell.observation_space.contains(obs)


def test_the_errors_form_one_tree() -> None:
    """Every envs error is a SnapgymError; task and Dockerfile errors are ConfigErrors."""
    for error in (envs.TaskError, envs.TaskNotFoundError, envs.DockerfileError):
        assert issubclass(error, ConfigError)
    for error in (envs.InvalidActionError, envs.ResetNeededError):
        assert issubclass(error, SnapgymError)
    assert issubclass(envs.TaskNotFoundError, LookupError)
