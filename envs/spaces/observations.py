"""What an agent sees: one text an LLM can read, plus the exit code for programs.

An observation is ``{"output": str, "exit_code": int64}``. ``output`` is the
command's stdout, then its stderr under a ``[stderr]`` line, then one status
line in brackets: ``[exit code 0]`` or ``[timed out after 30 s]`` (exit code
124), after ``[output truncated]`` when a stream hit its cap. On reset, ``output`` is the task
instruction and ``exit_code`` is -1. The separate streams and timings are in
``info`` for programs that want them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from envs.spaces.text import UnicodeText
from pool.results import ExecResult

NO_COMMAND = -1
"""``exit_code`` when no command ran (reset, a refused command)."""
TIMED_OUT = 124
"""``exit_code`` of a command killed at its timeout (as coreutils' ``timeout``)."""


def observation_space(max_output_chars: int) -> spaces.Dict:
    """The observation space of every snapgym environment."""
    return spaces.Dict(
        {
            "output": UnicodeText(max_output_chars, allow_nul=True),
            "exit_code": spaces.Box(low=NO_COMMAND, high=255, shape=(), dtype=np.int64),
        }
    )


def make_observation(text: str, exit_code: int) -> dict[str, Any]:
    """An observation from text and an exit code (clamped into the space)."""
    return {"output": text, "exit_code": np.array(min(max(exit_code, NO_COMMAND), 255), dtype=np.int64)}


def observe(result: ExecResult) -> dict[str, Any]:
    """Render a command's result for an agent."""
    parts = [result.stdout]
    if result.stderr:
        if parts[0] and not parts[0].endswith("\n"):
            parts.append("\n")
        parts.append(f"[stderr]\n{result.stderr}")
    text = "".join(parts)
    if text and not text.endswith("\n"):
        text += "\n"
    if result.truncated:
        text += "[output truncated]\n"
    if result.timed_out:
        text += f"[timed out after {result.duration_s:.0f} s]"
        return make_observation(text, TIMED_OUT)
    text += f"[exit code {result.exit_code}]"
    return make_observation(text, result.exit_code)


def exec_info(result: ExecResult) -> dict[str, Any]:
    """The parts of a result a program may want, for ``info``."""
    return {
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "timed_out": result.timed_out,
        "output_truncated": result.truncated,
        "exec_duration_s": result.duration_s,
    }
