"""The replay agent: actions from a list, a JSONL file or a RecordTrajectory recording, played by the runner.

The runs go through the real entry point (``python -m benchmarks.run agent=replay ...``) on the built-in
task log-error-count.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import envs
from benchmarks.agents import ReplayAgent
from benchmarks.agents.replay import ANY_TASK, load_actions
from envs.spaces.actions import SUBMIT
from pool import LocalBackend
from pool.errors import ConfigError
from tests.support.fixtures.runner_fixtures import SOLVE, TASK, run_benchmark

pytest_plugins = ["tests.support.fixtures.runner_fixtures"]


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


# -- reading a replay file ----------------------------------------------------------


def test_action_lines_apply_to_every_task_unless_they_name_one(tmp_path: Path) -> None:
    path = tmp_path / "actions.jsonl"
    path.write_text('{"action": "cd /app"}\n\n{"action": "ls", "task_id": "other"}\n{"action": "submit"}\n')
    assert load_actions(path) == {ANY_TASK: ["cd /app", SUBMIT], "other": ["ls"]}


@pytest.mark.parametrize(
    ("line", "message"),
    [("not json", "not JSON"), ('["ls"]', "expected an object"), ('{"action": 3}', "expected a string 'action'")],
)
def test_a_bad_line_is_a_config_error_naming_its_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "actions.jsonl"
    path.write_text('{"action": "ls"}\n' + line + "\n")
    with pytest.raises(ConfigError, match=f"actions.jsonl:2: {message}"):
        load_actions(path)


@pytest.mark.parametrize("options", [{}, {"path": "x.jsonl", "actions": ["ls"]}])
def test_the_agent_needs_a_file_or_a_list(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"agent\.path .* or agent\.actions"):
        ReplayAgent(**options)


# -- whole runs through the runner ---------------------------------------------------


@pytest.mark.timeout(120)
def test_replays_a_list_of_actions(tmp_path: Path, runner_store: Path) -> None:
    """Each action runs in turn (``cd`` persists), then the agent submits and the verifier scores 1."""
    actions = f'agent.actions=[cd /app,"{SOLVE.replace("/app/", "")}"]'
    run = run_benchmark(tmp_path, runner_store, "agent=replay", actions)
    assert run.summary()["mean_reward"] == 1.0
    result = run.result()
    assert (result["outcome"], result["end_reason"], result["agent"]) == ("scored", "submitted", "replay")


@pytest.mark.timeout(120)
def test_replays_a_jsonl_file_of_actions(tmp_path: Path, runner_store: Path) -> None:
    """Lines for another task are not played, and nothing after ``submit`` runs."""
    path = write_jsonl(
        tmp_path / "actions.jsonl",
        [
            {"action": "cd /app"},
            {"action": "rm -f answer.txt", "task_id": "some-other-task"},
            {"action": SOLVE},
            {"action": SUBMIT},
            {"action": "echo 0 > /app/answer.txt"},
        ],
    )
    run = run_benchmark(tmp_path, runner_store, "agent=replay", f"agent.path={path}")
    assert run.summary()["mean_reward"] == 1.0
    assert run.result()["end_reason"] == "submitted"


@pytest.mark.timeout(120)
def test_replays_a_recorded_trajectory(tmp_path: Path, runner_store: Path, backend: LocalBackend) -> None:
    """A RecordTrajectory file replays its task's first recorded episode, which scored 1 when recorded."""
    path = tmp_path / "trajectory.jsonl"
    env = envs.RecordTrajectory(gym.make("snapgym/Shell-v0", task=TASK, backend=backend), path)
    try:
        rewards = []
        for actions in ([SOLVE, SUBMIT], ["echo 0 > /app/answer.txt", SUBMIT]):
            env.reset(seed=0)
            for action in actions:
                _, reward, terminated, _, _ = env.step(action)
            assert terminated
            rewards.append(reward)
    finally:
        env.close()
    assert rewards == [1.0, 0.0]
    assert load_actions(path) == {TASK: [SOLVE, SUBMIT]}

    run = run_benchmark(tmp_path, runner_store, "agent=replay", f"agent.path={path}")
    assert run.summary()["mean_reward"] == 1.0
    assert run.result()["outcome"] == "scored"


@pytest.mark.timeout(120)
def test_a_missing_file_stops_the_run_before_any_sandbox(tmp_path: Path) -> None:
    store, missing = tmp_path / "store", tmp_path / "no-such.jsonl"
    run = run_benchmark(tmp_path, store, "agent=replay", f"agent.path={missing}")
    assert run.done.returncode == 2
    assert "ConfigError" in run.done.stderr
    assert f"{missing} does not exist" in run.done.stderr
    assert not store.exists()


@pytest.mark.timeout(120)
def test_a_task_without_recorded_actions_is_an_agent_error(tmp_path: Path, runner_store: Path) -> None:
    path = write_jsonl(tmp_path / "actions.jsonl", [{"action": SOLVE, "task_id": "some-other-task"}])
    run = run_benchmark(tmp_path, runner_store, "agent=replay", f"agent.path={path}")
    summary = run.summary()
    assert summary["counts"]["agent_error"] == 1
    assert summary["mean_reward"] == 0.0
    result = run.result()
    assert (result["outcome"], result["attempt"], result["steps"]) == ("agent_error", 1, 0)
    assert f"no actions for task {TASK}" in result["error"]
