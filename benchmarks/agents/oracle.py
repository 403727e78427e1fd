"""The reference-solution agent: it runs the task's ``solution/solve.sh``, then submits.

The solution enters the sandbox only now, through the sandbox's file API (as
Harbor's oracle uploads it; the script is never an action, so its size does not
count against ``max_action_bytes``), and runs as one action whose output is an
ordinary observation. That step gets the task's whole agent timeout
(``[agent] timeout_sec``), not the run's ``step_timeout_s``.
"""

from __future__ import annotations

import shlex
from typing import Any

from benchmarks.agents.base import AgentError, EpisodeContext, Observation
from envs.spaces.actions import SUBMIT
from envs.tasks.oracle import SOLUTION_DIR
from envs.tasks.verifier import copy_dir_into, run_script_command
from envs.wrappers import sandbox_env


class OracleAgent:
    """Plays every task with its reference solution; a task without one is an agent error."""

    def __init__(self) -> None:
        self.name = "oracle"
        self.whole_task_steps = True

    def start(self, episode: EpisodeContext) -> _OraclePolicy:
        """A policy that copies the solution in, runs it, and submits."""
        if episode.task.solution_dir is None:
            raise AgentError(f"task {episode.task.id} has no solution/solve.sh for the oracle to run")
        return _OraclePolicy(episode)


class _OraclePolicy:
    def __init__(self, episode: EpisodeContext) -> None:
        self._episode = episode
        self._ran = False

    def act(self, observation: Observation, info: dict[str, Any]) -> str:
        if self._ran:
            return SUBMIT
        self._ran = True
        task = self._episode.task
        sandbox = sandbox_env(self._episode.env).sandbox
        assert sandbox is not None
        assert task.solution_dir is not None
        copy_dir_into(sandbox, task.solution_dir, SOLUTION_DIR)
        return solution_action(self._episode.env_id, task.settings.solution_env)


def solution_action(env_id: str, solution_env: dict[str, str] | Any) -> str:
    """The action that runs ``/solution/solve.sh`` (then removes /solution) in an env of ``env_id``."""
    assignments = " ".join(f"{name}={shlex.quote(value)}" for name, value in dict(solution_env).items())
    script = f"env {assignments} sh -c {shlex.quote(run_script_command(SOLUTION_DIR + '/solve.sh'))}"
    command = f"({script}); snapgym_status=$?; rm -rf {SOLUTION_DIR}; (exit $snapgym_status)"
    if env_id.endswith("Python-v0"):
        return (
            "import subprocess as _sp, sys as _sys\n"
            f"_r = _sp.run(['/bin/sh', '-c', {command!r}], capture_output=True, text=True)\n"
            "print(_r.stdout, end=''); print(_r.stderr, end='', file=_sys.stderr)\n"
            "_r.returncode"
        )
    return command
