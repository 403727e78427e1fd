"""The replay agent: actions from a JSONL file (such as a ``RecordTrajectory`` recording) or a list.

A line is ``{"action": "..."}``, optionally with ``"task_id"``, or a
``RecordTrajectory`` event: a ``reset`` event names the task (in its info)
and the ``step`` events after it carry the actions. Each task replays the
first recorded episode of that task; lines without a task apply to every
task. When the actions run out, the agent submits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.agents.base import AgentError, EpisodeContext, Observation
from envs.spaces.actions import SUBMIT
from pool.errors import ConfigError

ANY_TASK = "*"


class ReplayAgent:
    """Replays recorded actions per task.

    Args:
        path: a JSONL file of actions or a trajectory recorded by ``envs.RecordTrajectory``.
        actions: actions for every task, used when ``path`` is None.

    Raises:
        ConfigError: neither or both given, the file is missing, or a line is not an action record.
    """

    def __init__(self, *, path: str | Path | None = None, actions: Sequence[str] = ()) -> None:
        self.name = "replay"
        self.whole_task_steps = False
        if (path is None) == (not actions):
            raise ConfigError("the replay agent needs agent.path (a JSONL file) or agent.actions (a list), not both")
        self.script = load_actions(Path(path)) if path is not None else {ANY_TASK: list(actions)}

    def start(self, episode: EpisodeContext) -> _ReplayPolicy:
        """A policy that plays the task's recorded actions, then submits."""
        actions = self.script.get(episode.task.id, self.script.get(ANY_TASK))
        if actions is None:
            raise AgentError(
                f"the replay file has no actions for task {episode.task.id} (it has {sorted(self.script)})"
            )
        return _ReplayPolicy(actions)

    def resume(self, episode: EpisodeContext, state: Mapping[str, Any]) -> _ReplayPolicy:
        """The policy that had played ``state["position"]`` of the task's actions.

        Raises:
            AgentError: the position is not one of the task's actions.
        """
        policy = self.start(episode)
        position = state.get("position")
        if not isinstance(position, int) or isinstance(position, bool) or not 0 <= position <= len(policy.actions):
            raise AgentError(f"a replay position must be in [0, {len(policy.actions)}], got {position!r}")
        policy.position = position
        return policy


class _ReplayPolicy:
    def __init__(self, actions: list[str]) -> None:
        self.actions = actions
        self.position = 0

    def act(self, observation: Observation, info: dict[str, Any]) -> str:
        if self.position >= len(self.actions):
            return SUBMIT
        self.position += 1
        return self.actions[self.position - 1]

    def state(self) -> dict[str, Any]:
        return {"position": self.position}


def load_actions(path: Path) -> dict[str, list[str]]:
    """Task id (or ``"*"``) -> actions, from a JSONL file."""
    if not path.is_file():
        raise ConfigError(f"replay file {path} does not exist; set agent.path to a JSONL file of actions")
    script: dict[str, list[str]] = {}
    current: str | None = None
    finished: set[str] = set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        record = _parse(path, number, line)
        if record.get("event") == "reset":
            task = str(record.get("info", {}).get("task_id", ANY_TASK))
            if current is not None:
                finished.add(current)
            current = None if task in finished else task
            script.setdefault(task, [])
            continue
        task = str(record.get("task_id", current if record.get("event") == "step" else ANY_TASK) or ANY_TASK)
        if record.get("event") == "step" and current is None:
            continue  # a later episode of a task already recorded
        script.setdefault(task, []).append(_action(path, number, record))
    return script


def _parse(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{number}: not JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{path}:{number}: expected an object with an 'action'")
    return record


def _action(path: Path, number: int, record: dict[str, Any]) -> str:
    action = record.get("action")
    if not isinstance(action, str):
        raise ConfigError(f"{path}:{number}: expected a string 'action', got {action!r}")
    return action
