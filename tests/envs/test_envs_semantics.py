"""Gymnasium semantics of Shell-v0 and Python-v0: reset, step, timeouts, submit, limits, close."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from pool import LocalBackend
from tests.support.fixtures.envs_fixtures import SOLVE, TASK, write_task

INFO_KEYS = {"task_id", "snapshot_id", "start_digest", "reset_latency_s"}


@pytest.fixture(scope="module")
def shell(backend: LocalBackend) -> Iterator[gym.Env[dict[str, Any], str]]:
    env = gym.make("snapgym/Shell-v0", task=TASK, backend=backend)
    yield env
    env.close()


@pytest.fixture(scope="module")
def python(backend: LocalBackend) -> Iterator[gym.Env[dict[str, Any], str]]:
    env = gym.make("snapgym/Python-v0", task=TASK, backend=backend)
    yield env
    env.close()


def run(env: gym.Env[dict[str, Any], str], action: str) -> dict[str, Any]:
    """Step an action that must neither end the episode nor fail for infrastructure reasons."""
    obs, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated) == (0.0, False, False), info
    return obs


# -- Gymnasium's own checker ------------------------------------------------------


@pytest.mark.parametrize("env_id", envs.ENV_IDS)
def test_env_checker_passes(env_id: str, backend: LocalBackend) -> None:
    """Gymnasium's env checker accepts both environments (spaces, reset, step, seeding)."""
    env = gym.make(env_id, task=TASK, backend=backend)
    try:
        check_env(env.unwrapped, skip_render_check=True, skip_close_check=True)
    finally:
        env.close()


@pytest.mark.parametrize("env_id", envs.ENV_IDS)
def test_env_checker_passes_in_full_with_a_given_backend(env_id: str, backend: LocalBackend) -> None:
    """The full env checker (which re-makes the env from its spec) passes when a backend is given."""
    env = gym.make(env_id, task=TASK, backend=backend)
    try:
        check_env(env.unwrapped)
    finally:
        env.close()


# -- reset ------------------------------------------------------------------------


def test_reset_returns_the_instruction_and_start_info(shell: gym.Env[dict[str, Any], str]) -> None:
    """reset() shows the task's instruction with exit_code -1 and reports where the episode starts."""
    obs, info = shell.reset(seed=3)
    task = envs.load_task(TASK)
    assert obs["output"] == task.instruction
    assert int(obs["exit_code"]) == envs.NO_COMMAND == -1
    assert shell.observation_space.contains(obs)
    assert info.keys() >= INFO_KEYS
    assert info["task_id"] == TASK
    assert isinstance(info["start_digest"], str) and info["start_digest"]
    assert info["reset_latency_s"] >= 0.0


def test_resets_start_from_the_same_state_and_forget_the_last_episode(shell: gym.Env[dict[str, Any], str]) -> None:
    """Two resets give one digest; files, exported variables and background processes do not survive."""
    _, first = shell.reset()
    run(shell, "echo left > /app/leftover; echo t > /tmp/leftover; export LEAK=yes")
    run(shell, "(setsid sleep 3001 >/dev/null 2>&1 &); nohup sleep 3002 >/dev/null 2>&1 &")
    # a step now takes well under a millisecond: give the background sleeps time to exec
    wait_for_both = (
        "for i in $(seq 100); do n=$(ps -eo args | grep -c '^sleep 300[12]'); [ $n = 2 ] && break; sleep 0.05; done"
        "; echo $n"
    )
    assert run(shell, wait_for_both)["output"].startswith("2\n")
    _, second = shell.reset()
    assert second["start_digest"] == first["start_digest"]
    assert second["snapshot_id"] == first["snapshot_id"]
    obs = run(shell, "ls /app/leftover /tmp/leftover 2>&1; echo LEAK=${LEAK-unset}; ps -eo args | grep -c '^sleep 300'")
    assert "No such file" in obs["output"]
    assert "LEAK=unset" in obs["output"]
    assert "\n0\n" in obs["output"]


# -- step -------------------------------------------------------------------------


def test_step_reports_output_exit_code_and_exec_timing(shell: gym.Env[dict[str, Any], str]) -> None:
    """A step's observation has stdout, stderr and the exit status; info has the streams and exec time."""
    shell.reset()
    obs, reward, terminated, truncated, info = shell.step("echo out; echo err >&2; exit 3")
    assert int(obs["exit_code"]) == 3
    assert obs["output"] == "out\n[stderr]\nerr\n[exit code 3]"
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["stdout"] == "out\n" and info["stderr"] == "err\n"
    assert isinstance(info["exec_duration_s"], float) and info["exec_duration_s"] >= 0.0
    assert info["step"] == 1
    assert shell.observation_space.contains(obs)


def test_a_timeout_is_an_observation_and_the_episode_goes_on(backend: LocalBackend) -> None:
    """A command over step_timeout_s is killed: exit_code 124, the message says so, the next step works."""
    env = envs.ShellEnv(TASK, backend=backend, step_timeout_s=0.5)
    try:
        env.reset()
        obs, reward, terminated, truncated, info = env.step("sleep 30; echo never")
        assert int(obs["exit_code"]) == envs.TIMED_OUT == 124
        assert "timed out" in obs["output"] and "never" not in obs["output"]
        assert info["timed_out"] is True
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert run(env, "echo alive")["output"] == "alive\n[exit code 0]"
    finally:
        env.close()


def test_submit_after_the_right_work_scores_one(shell: gym.Env[dict[str, Any], str]) -> None:
    """Writing 127 to /app/answer.txt, then submit: terminated, reward 1.0 from the verifier."""
    shell.reset()
    run(shell, SOLVE)
    obs, reward, terminated, truncated, info = shell.step(envs.SUBMIT)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert int(obs["exit_code"]) == envs.NO_COMMAND
    assert info["end_reason"] == "submitted" and info["scored"] is True
    assert info["verifier"]["reward"] == 1.0 and info["verifier"]["error"] is None
    assert "infra_error" not in info


def test_submit_without_work_scores_zero(shell: gym.Env[dict[str, Any], str]) -> None:
    """Submitting the untouched start state: terminated, a scored reward of 0.0."""
    shell.reset()
    _, reward, terminated, truncated, info = shell.step(f"  {envs.SUBMIT}\n")
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["scored"] is True and info["verifier"]["reward"] == 0.0


def test_a_wrong_answer_scores_zero(shell: gym.Env[dict[str, Any], str]) -> None:
    """The verifier checks the answer, not only that a file exists."""
    shell.reset()
    run(shell, "echo 126 > /app/answer.txt")
    _, reward, terminated, _, info = shell.step(envs.SUBMIT)
    assert (reward, terminated, info["scored"]) == (0.0, True, True)


def test_the_step_limit_truncates_and_the_verifier_still_runs(backend: LocalBackend) -> None:
    """At max_steps the episode is truncated, and the end state is still scored."""
    env = envs.ShellEnv(TASK, backend=backend, max_steps=2)
    try:
        env.reset()
        run(env, SOLVE)
        _, reward, terminated, truncated, info = env.step("true")
        assert (terminated, truncated) == (False, True)
        assert info["end_reason"] == "max_steps" and info["step"] == 2
        assert info["scored"] is True and info["verifier"]["reward"] == 1.0
        assert reward == 1.0
    finally:
        env.close()


def test_the_agent_time_limit_truncates_and_the_verifier_still_runs(backend: LocalBackend, tmp_path: Path) -> None:
    """A step that ends after [agent].timeout_sec truncates the episode, and the verifier runs."""
    task = write_task(tmp_path, task_toml='version = "1.0"\n[agent]\ntimeout_sec = 0.01\n')
    env = envs.ShellEnv(task, backend=backend)
    try:
        env.reset()
        _, reward, terminated, truncated, info = env.step("touch /app/done; sleep 0.1")
        assert (terminated, truncated) == (False, True)
        assert info["end_reason"] == "agent_timeout"
        assert info["scored"] is True and reward == 1.0
    finally:
        env.close()


def test_close_is_idempotent_and_final(backend: LocalBackend) -> None:
    """close() twice is fine; the environment cannot be reset afterwards."""
    env = gym.make("snapgym/Shell-v0", task=TASK, backend=backend)
    env.reset()
    sandbox = env.unwrapped.sandbox  # type: ignore[attr-defined]
    env.close()
    env.close()
    assert env.unwrapped.state is envs.EpisodeState.CLOSED  # type: ignore[attr-defined]
    assert sandbox.is_closed
    with pytest.raises(envs.ResetNeededError, match="closed"):
        env.unwrapped.reset()


def test_render_ansi_returns_the_last_observation_text(backend: LocalBackend) -> None:
    """render() in "ansi" mode is the last observation's text; without a render mode it is None."""
    env = envs.ShellEnv(TASK, backend=backend, render_mode="ansi")
    try:
        obs, _ = env.reset()
        assert env.render() == obs["output"]
        obs = run(env, "echo shown")
        assert env.render() == obs["output"] == "shown\n[exit code 0]"
    finally:
        env.close()
    plain = envs.ShellEnv(TASK, backend=backend)
    try:
        plain.reset()
        assert plain.render() is None
    finally:
        plain.close()


# -- Shell-v0 ---------------------------------------------------------------------


def test_shell_keeps_its_state_between_steps_as_a_terminal_does(shell: gym.Env[dict[str, Any], str]) -> None:
    """cd, variables (exported or not) and functions carry over to the next step (the local backend
    keeps one bash per episode); reset starts from scratch."""
    shell.reset()
    assert run(shell, "pwd")["output"] == "/app\n[exit code 0]"
    run(shell, "mkdir -p /tmp/work/sub && cd /tmp/work; export KEPT='a b'; LOCAL=kept; greet() { echo hi $1; }")
    run(shell, "cd sub")
    obs = run(shell, 'pwd; echo "kept=$KEPT local=${LOCAL-unset}"; greet you')
    assert obs["output"] == "/tmp/work/sub\nkept=a b local=kept\nhi you\n[exit code 0]"
    shell.reset()
    assert run(shell, "pwd; echo ${KEPT-unset} ${LOCAL-unset}")["output"] == "/app\nunset unset\n[exit code 0]"


def test_shell_passes_multiline_scripts_and_quotes_intact(shell: gym.Env[dict[str, Any], str]) -> None:
    """An action is a bash script: several lines, quotes and $ reach bash unchanged."""
    shell.reset()
    obs = run(shell, "x='it'\"'\"'s $HOME'\nfor i in 1 2; do echo \"$i:$x\"; done")
    assert obs["output"] == "1:it's $HOME\n2:it's $HOME\n[exit code 0]"


def test_shell_commands_read_an_empty_stdin(shell: gym.Env[dict[str, Any], str]) -> None:
    """A command that reads stdin (cat, read) gets end-of-file at once instead of waiting for input."""
    shell.reset()
    assert run(shell, "cat; read -r line; echo rc=$?")["output"] == "rc=1\n[exit code 0]"


def test_long_output_is_capped_and_says_so(backend: LocalBackend) -> None:
    """Output beyond max_output_bytes is cut, the observation says so, and info flags it."""
    env = envs.ShellEnv(TASK, backend=backend, max_output_bytes=1000)
    try:
        env.reset()
        obs = run(env, "seq 1 100000")
        assert obs["output"].startswith("1\n2\n3\n")
        assert obs["output"].endswith("[output truncated]\n[exit code 0]")
        assert len(obs["output"]) < 1100
        assert env.observation_space.contains(obs)
    finally:
        env.close()


# -- Python-v0 --------------------------------------------------------------------


def test_python_keeps_variables_within_an_episode_not_across_reset(python: gym.Env[dict[str, Any], str]) -> None:
    """Variables and imports survive between steps; reset gives a fresh interpreter."""
    python.reset()
    assert run(python, "import os\nx = 41")["output"] == "[exit code 0]"
    assert run(python, "x + 1")["output"] == "42\n[exit code 0]"
    assert run(python, "print(os.getcwd())")["output"] == "/app\n[exit code 0]"
    python.reset()
    obs, reward, terminated, truncated, _ = python.step("x")
    assert int(obs["exit_code"]) == 1 and "NameError" in obs["output"]
    assert (reward, terminated, truncated) == (0.0, False, False)


def test_python_exception_gives_exit_code_1_and_the_traceback(python: gym.Env[dict[str, Any], str]) -> None:
    """An exception is an observation: exit code 1, its traceback on stderr; the interpreter lives on."""
    python.reset()
    run(python, "y = 'kept'")
    obs, reward, terminated, truncated, info = python.step("def f():\n    raise ValueError('boom')\nf()")
    assert int(obs["exit_code"]) == 1
    assert "Traceback" in info["stderr"] and "ValueError: boom" in info["stderr"]
    assert "[stderr]" in obs["output"] and obs["output"].endswith("[exit code 1]")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert run(python, "y")["output"] == "'kept'\n[exit code 0]"


def test_python_submit_is_scored_by_the_verifier(python: gym.Env[dict[str, Any], str]) -> None:
    """Python-v0 episodes end with the same verifier: solving in Python scores 1.0."""
    python.reset()
    run(python, "open('/app/answer.txt', 'w').write('127\\n')")
    _, reward, terminated, truncated, info = python.step(envs.SUBMIT)
    assert (reward, terminated, truncated) == (1.0, True, False) and info["scored"] is True


def test_python_timeout_interrupts_the_cell_and_keeps_variables(backend: LocalBackend) -> None:
    """A cell over the step timeout is interrupted: exit code 124, and earlier variables are kept."""
    env = envs.PythonEnv(TASK, backend=backend, step_timeout_s=1.0)
    try:
        env.reset()
        run(env, "z = 7")
        obs, reward, terminated, truncated, _ = env.step("import time\nwhile True: time.sleep(0.01)")
        assert int(obs["exit_code"]) == envs.TIMED_OUT
        assert "timed out" in obs["output"]
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert run(env, "z")["output"] == "7\n[exit code 0]"
    finally:
        env.close()


def test_a_cell_that_unwinds_slowly_after_the_interrupt_keeps_the_variables(backend: LocalBackend) -> None:
    """On a busy machine an interrupted cell may take a while to print its traceback and answer: a second
    (a stand-in for that load) is within the interrupt's grace, so the interpreter and its variables stay."""
    env = envs.PythonEnv(TASK, backend=backend, step_timeout_s=1.0)
    try:
        env.reset()
        run(env, "z = 7")
        slow = "import time\ntry:\n    while True: time.sleep(0.01)\nexcept KeyboardInterrupt:\n"
        slow += "    time.sleep(1.0)\n    raise"
        obs, _, _, _, _ = env.step(slow)
        assert int(obs["exit_code"]) == envs.TIMED_OUT and "variables are kept" in obs["output"], obs["output"]
        assert run(env, "z")["output"] == "7\n[exit code 0]"
    finally:
        env.close()


def test_python_timeout_sets_timed_out_in_info(backend: LocalBackend) -> None:
    """info["timed_out"] agrees with the observation when a Python cell times out."""
    env = envs.PythonEnv(TASK, backend=backend, step_timeout_s=1.0)
    try:
        env.reset()
        obs, _, _, _, info = env.step("import time\nwhile True: time.sleep(0.01)")
        assert int(obs["exit_code"]) == envs.TIMED_OUT
        assert info["timed_out"] is True
    finally:
        env.close()


def test_python_recovers_after_a_cell_kills_the_interpreter(backend: LocalBackend) -> None:
    """A cell that ends the interpreter process is reported, and the next cell runs in a fresh one."""
    env = envs.PythonEnv(TASK, backend=backend, step_timeout_s=0.5)
    try:
        env.reset()
        obs, _, _, _, _ = env.step("import os\nos._exit(3)")
        assert int(obs["exit_code"]) != 0
        assert run(env, "1 + 1")["output"] == "2\n[exit code 0]"
    finally:
        env.close()


def test_observations_are_numpy_int64_exit_codes(shell: gym.Env[dict[str, Any], str]) -> None:
    """exit_code is a 0-d int64 array, as the observation space declares."""
    obs, _ = shell.reset()
    assert isinstance(obs["exit_code"], np.ndarray) and obs["exit_code"].dtype == np.int64
    assert obs["exit_code"].shape == ()
