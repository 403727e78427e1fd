"""An episode's ATIF trajectory: its shape, and the caps that keep one episode from filling the disk."""

from __future__ import annotations

from envs import SUBMIT
from envs.spaces.trajectory import MAX_OBSERVATION_CHARS, MAX_STEPS, Trajectory


def test_a_huge_observation_keeps_its_head_and_tail_and_says_so() -> None:
    trajectory = Trajectory("do it")
    output = "A" * MAX_OBSERVATION_CHARS + "B" * MAX_OBSERVATION_CHARS
    trajectory.add("yes", {"output": output, "exit_code": 0}, {"exec_duration_s": 0.1}, None)
    document = trajectory.as_atif(session_id="s", agent="a", env_id="snapgym/Shell-v0")
    content = document["steps"][1]["observation"]["results"][0]["content"]
    assert content.startswith("A" * 100) and content.endswith("B" * 100)
    assert len(content) < MAX_OBSERVATION_CHARS + 100 and f"[... {MAX_OBSERVATION_CHARS} characters cut ...]" in content
    assert document["extra"]["truncated"] == {"texts_cut": 1}


def test_steps_past_the_cap_are_counted_not_written_and_tokens_are_summed() -> None:
    trajectory = Trajectory("do it", "python")
    turn = {"message": "m", "model_name": "x", "prompt_tokens": 3, "completion_tokens": 2}
    for _ in range(MAX_STEPS + 5):
        trajectory.add("print(1)", {"output": "1", "exit_code": 0}, {}, turn)
    trajectory.add(SUBMIT, {"output": "[submitted]", "exit_code": 0}, {}, None)
    document = trajectory.as_atif(session_id="s", agent="a", env_id="snapgym/Python-v0", model_name="x")
    assert len(document["steps"]) == MAX_STEPS + 1
    assert document["steps"][1]["tool_calls"][0]["function_name"] == "python"
    assert document["extra"]["truncated"] == {"steps_not_written": 6}
    assert document["final_metrics"] == {
        "total_steps": MAX_STEPS + 6,
        "total_prompt_tokens": 3 * (MAX_STEPS + 5),
        "total_completion_tokens": 2 * (MAX_STEPS + 5),
    }
