"""The vector environment (batched, NEXT_STEP autoreset) and the wrappers for agent loops."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import envs
from pool import ConfigError, LocalBackend
from tests.support.fixtures.envs_fixtures import SOLVE, TASK

# -- SandboxVectorEnv -------------------------------------------------------------------


@pytest.fixture(scope="module")
def vec(backend: LocalBackend) -> Iterator[envs.SandboxVectorEnv]:
    env = gym.make_vec("snapgym/Shell-v0", num_envs=3, task=TASK, backend=backend)
    yield env  # type: ignore[misc]
    env.close()


def test_make_vec_builds_a_sandbox_vector_env(vec: envs.SandboxVectorEnv) -> None:
    """gym.make_vec uses the snapgym vector entry point: 3 ShellEnvs, NEXT_STEP autoreset."""
    assert isinstance(vec, envs.SandboxVectorEnv)
    assert vec.num_envs == 3
    assert all(isinstance(e, envs.ShellEnv) for e in vec.envs)
    assert vec.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP


def test_vector_reset_batches_observations_and_infos(vec: envs.SandboxVectorEnv) -> None:
    """reset() gives batched observations and per-env infos with one start digest."""
    obs, infos = vec.reset(seed=7)
    assert obs["exit_code"].shape == (3,)
    assert obs["exit_code"].tolist() == [-1, -1, -1]
    instruction = envs.load_task(TASK).instruction
    assert tuple(obs["output"]) == (instruction,) * 3
    assert infos["_start_digest"].tolist() == [True, True, True]
    assert len(set(infos["start_digest"].tolist())) == 1
    assert infos["task_id"].tolist() == [TASK] * 3
    assert vec.observation_space.contains(obs)
    assert len({id(e.sandbox) for e in vec.envs}) == 3


def test_vector_step_runs_each_action_in_its_own_sandbox(vec: envs.SandboxVectorEnv) -> None:
    """step() takes one action per env; the sandboxes are independent."""
    vec.reset()
    obs, rewards, terminated, truncated, infos = vec.step(("echo zero > /app/who", "echo one > /app/who", "true"))
    assert obs["exit_code"].tolist() == [0, 0, 0]
    assert rewards.tolist() == [0.0, 0.0, 0.0] and rewards.dtype == np.float64
    assert terminated.tolist() == [False] * 3 and truncated.tolist() == [False] * 3
    assert infos["step"].tolist() == [1, 1, 1]
    obs, *_ = vec.step(["cat /app/who"] * 3)
    assert obs["output"][0] == "zero\n[exit code 0]"
    assert obs["output"][1] == "one\n[exit code 0]"
    assert "No such file" in obs["output"][2]


def test_vector_autoresets_an_ended_env_on_the_next_step(vec: envs.SandboxVectorEnv) -> None:
    """An env that submits is scored, then reset on the next step (its action ignored), reward 0."""
    _, infos = vec.reset()
    digest = infos["start_digest"][0]
    vec.step((SOLVE, SOLVE, "echo wrong > /app/answer.txt"))
    obs, rewards, terminated, truncated, infos = vec.step(("echo still", envs.SUBMIT, envs.SUBMIT))
    assert rewards.tolist() == [0.0, 1.0, 0.0]
    assert terminated.tolist() == [False, True, True]
    assert truncated.tolist() == [False, False, False]
    assert infos["_verifier"].tolist() == [False, True, True]
    assert infos["scored"][1] and infos["scored"][2]
    obs, rewards, terminated, truncated, infos = vec.step(("cat /app/answer.txt", "touch /app/ignored", "true"))
    assert obs["output"][0] == "127\n[exit code 0]"
    instruction = envs.load_task(TASK).instruction
    assert obs["output"][1] == obs["output"][2] == instruction
    assert obs["exit_code"].tolist() == [0, -1, -1]
    assert rewards.tolist() == [0.0, 0.0, 0.0]
    assert infos["_start_digest"].tolist() == [False, True, True]
    assert infos["start_digest"][1] == digest
    obs, *_ = vec.step(("true", "ls /app", "true"))
    assert obs["output"][1] == "access.log\n[exit code 0]"  # the ignored action never ran


def test_vector_rejects_the_wrong_number_of_actions(vec: envs.SandboxVectorEnv) -> None:
    """Two actions for three environments is an error, not a silent partial step."""
    vec.reset()
    with pytest.raises(ConfigError, match="2 actions for 3"):
        vec.step(("true", "true"))


def test_a_vector_env_from_env_functions(backend: LocalBackend) -> None:
    """SandboxVectorEnv([fn, fn]) steps ShellEnvs made by the functions."""
    vec = envs.SandboxVectorEnv([lambda: envs.ShellEnv(TASK, backend=backend)] * 2)
    try:
        obs, _ = vec.reset()
        assert obs["exit_code"].shape == (2,)
        obs, rewards, *_ = vec.step(["echo a", "echo b"])
        assert tuple(obs["output"]) == ("a\n[exit code 0]", "b\n[exit code 0]")
        assert rewards.shape == (2,)
    finally:
        vec.close()
    assert all(e.state is envs.EpisodeState.CLOSED for e in vec.envs)
    with pytest.raises(ConfigError, match="at least one"):
        envs.SandboxVectorEnv([])


def test_make_vec_of_python_envs(backend: LocalBackend) -> None:
    """gym.make_vec("snapgym/Python-v0") gives independent interpreters, one per sub-environment."""
    vec = gym.make_vec("snapgym/Python-v0", num_envs=2, task=TASK, backend=backend)
    try:
        assert isinstance(vec, envs.SandboxVectorEnv)
        assert all(isinstance(e, envs.PythonEnv) for e in vec.envs)
        vec.reset()
        vec.step(("x = 'first'", "x = 'second'"))
        obs, *_ = vec.step(("x", "x"))
        assert tuple(obs["output"]) == ("'first'\n[exit code 0]", "'second'\n[exit code 0]")
    finally:
        vec.close()


# -- RecordTrajectory -----------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSONL file, each parsed on its own."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_record_trajectory_writes_one_json_object_per_event(backend: LocalBackend, tmp_path: Path) -> None:
    """A reset line, then a line per step with action, observation, reward and exec timing; appends later."""
    path = tmp_path / "runs" / "trajectory.jsonl"
    env = envs.RecordTrajectory(envs.ShellEnv(TASK, backend=backend), path)
    env.reset(seed=5)
    env.step("echo hi")
    env.step(SOLVE)
    env.step(envs.SUBMIT)
    env.reset()
    env.close()
    lines = read_jsonl(path)
    assert [line["event"] for line in lines] == ["reset", "step", "step", "step", "reset"]
    reset, hi, _, submit, second = lines
    assert reset["seed"] == 5
    assert reset["observation"] == envs.load_task(TASK).instruction
    assert reset["info"]["task_id"] == TASK and reset["info"]["start_digest"]
    assert hi["action"] == "echo hi"
    assert hi["observation"] == "hi\n[exit code 0]"
    assert hi["exit_code"] == 0 and hi["reward"] == 0.0
    assert (hi["terminated"], hi["truncated"]) == (False, False)
    assert isinstance(hi["info"]["exec_duration_s"], float)
    assert submit["reward"] == 1.0 and submit["terminated"] is True
    assert submit["info"]["verifier"]["reward"] == 1.0
    assert len({line["episode"] for line in lines[:4]}) == 1
    assert second["episode"] != reset["episode"]
    again = envs.RecordTrajectory(envs.ShellEnv(TASK, backend=backend), path, fsync=True)
    again.reset()
    again.step(envs.SUBMIT)
    again.close()
    assert len(read_jsonl(path)) == 7


def test_record_trajectory_also_writes_each_episode_in_atif(backend: LocalBackend, tmp_path: Path) -> None:
    """With atif_dir, every finished episode is an ATIF document, as the runner writes per episode."""
    env = envs.RecordTrajectory(envs.ShellEnv(TASK, backend=backend), tmp_path / "t.jsonl", atif_dir=tmp_path / "atif",
                                agent="me")  # fmt: skip
    env.reset()
    env.step("echo hi")
    env.step(envs.SUBMIT)
    env.reset()  # unfinished: not written
    env.close()
    (written,) = (tmp_path / "atif").glob("*.json")
    document = json.loads(written.read_text())
    assert document["schema_version"] == "ATIF-v1.4" and document["agent"]["name"] == "me"
    assert document["session_id"] == read_jsonl(tmp_path / "t.jsonl")[0]["episode"] == written.stem
    user, hi, submit = document["steps"]
    assert user["message"] == envs.load_task(TASK).instruction
    assert hi["tool_calls"][0]["arguments"] == {"command": "echo hi"}
    assert hi["observation"]["results"][0]["content"] == "hi\n[exit code 0]"
    assert submit["tool_calls"][0]["function_name"] == "submit"


# -- CommandPolicy --------------------------------------------------------------------------


def test_a_denied_command_is_refused_unrun_and_counts_as_a_step(backend: LocalBackend) -> None:
    """A command matching a deny pattern does not run; the observation says why; it uses up a step."""
    env = envs.CommandPolicy(envs.ShellEnv(TASK, backend=backend, max_steps=2), deny=[r"rm\s+-rf\s+/"])
    try:
        env.reset()
        obs, reward, terminated, truncated, info = env.step("touch /app/ran; rm -rf /")
        assert int(obs["exit_code"]) == envs.NO_COMMAND
        assert "refused" in obs["output"] and repr(r"rm\s+-rf\s+/") in obs["output"]
        assert "denied pattern" in info["refused"]
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert info["step"] == 1
        obs, _, terminated, truncated, info = env.step("ls /app")
        assert obs["output"] == "access.log\n[exit code 0]"  # /app/ran was never created
        assert (terminated, truncated, info["end_reason"]) == (False, True, "max_steps")
    finally:
        env.close()


def test_a_check_callback_refuses_or_allows(backend: LocalBackend) -> None:
    """check() returning a reason refuses the action; returning None lets it run."""

    def no_python(action: str) -> str | None:
        return "python is not allowed here" if "python" in action else None

    env = envs.CommandPolicy(envs.ShellEnv(TASK, backend=backend), check=no_python)
    try:
        env.reset()
        obs, _, _, _, info = env.step('python3 -c \'open("/app/p", "w")\'')
        assert info["refused"] == "python is not allowed here" and "python is not allowed" in obs["output"]
        obs, _, _, _, info = env.step("ls /app")
        assert obs["output"] == "access.log\n[exit code 0]" and "refused" not in info
        assert env.reason("echo fine") is None
        with pytest.raises(envs.InvalidActionError):
            env.step(123)  # type: ignore[arg-type]
    finally:
        env.close()


def test_command_policy_rejects_bad_patterns_and_foreign_envs(backend: LocalBackend) -> None:
    """An invalid regex and a non-snapgym environment are configuration errors."""
    shell = envs.ShellEnv(TASK, backend=backend)
    try:
        with pytest.raises(ConfigError, match="invalid deny pattern"):
            envs.CommandPolicy(shell, deny=["(unclosed"])
    finally:
        shell.close()
    cartpole = gym.make("CartPole-v1")
    try:
        with pytest.raises(ConfigError, match="snapgym environments only"):
            envs.CommandPolicy(cartpole, deny=["x"])
    finally:
        cartpole.close()


def test_a_refused_step_before_reset_is_an_error(backend: LocalBackend) -> None:
    """A policy cannot be used to step an environment that was never reset."""
    env = envs.CommandPolicy(envs.ShellEnv(TASK, backend=backend), deny=["rm"])
    try:
        with pytest.raises(envs.ResetNeededError):
            env.step("rm x")
    finally:
        env.close()


# -- TruncateOutput -----------------------------------------------------------------------


def test_truncate_output_keeps_head_tail_and_the_status_line(backend: LocalBackend) -> None:
    """A long output keeps its start and end around an omission marker; the exit status line survives."""
    env = envs.TruncateOutput(envs.ShellEnv(TASK, backend=backend), max_chars=200)
    try:
        obs, _ = env.reset()
        assert obs["output"] == envs.load_task(TASK).instruction  # shorter than max_chars: unchanged
        obs, _, _, _, info = env.step("seq 1 5000")
        text = obs["output"]
        assert len(text) <= 200
        assert text.startswith("1\n2\n3\n")
        assert "characters omitted" in text
        assert text.endswith("4999\n5000\n[exit code 0]")
        assert info["stdout"].endswith("5000\n")  # info keeps the full streams
        obs, *_ = env.step("echo short")
        assert obs["output"] == "short\n[exit code 0]"
    finally:
        env.close()


def test_truncate_output_head_fraction_and_bad_arguments(backend: LocalBackend) -> None:
    """head_fraction moves the cut; out-of-range settings are ConfigErrors."""
    shell = envs.ShellEnv(TASK, backend=backend)
    env = envs.TruncateOutput(shell, max_chars=100, head_fraction=0.0)
    try:
        env.reset()
        obs, *_ = env.step("seq 1 3000")
        assert obs["output"].startswith("\n[... ") and obs["output"].endswith("3000\n[exit code 0]")
        with pytest.raises(ConfigError):
            envs.TruncateOutput(shell, max_chars=10)
        with pytest.raises(ConfigError):
            envs.TruncateOutput(shell, head_fraction=1.5)
    finally:
        env.close()


def test_wrappers_compose(backend: LocalBackend, tmp_path: Path) -> None:
    """RecordTrajectory over CommandPolicy over TruncateOutput records what the agent actually saw."""
    path = tmp_path / "t.jsonl"
    env = envs.RecordTrajectory(
        envs.CommandPolicy(envs.TruncateOutput(envs.ShellEnv(TASK, backend=backend), max_chars=100), deny=["reboot"]),
        path,
    )
    try:
        env.reset()
        env.step("seq 1 1000")
        env.step("reboot")
    finally:
        env.close()
    _, long, refused = read_jsonl(path)
    assert len(long["observation"]) <= 100 and "omitted" in long["observation"]
    assert "refused" in refused["observation"] and refused["info"]["refused"]
