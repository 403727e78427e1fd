"""An episode's trajectory in Harbor's Agent Trajectory Interchange Format (ATIF v1.4).

Step 1 is the task's instruction (``source: user``); each action is an agent
step with one tool call (``shell`` or ``python``, ``arguments.command``) and
its observation (the output the agent saw, the exit code, the time it took);
``submit`` is a call of ``submit``.
A model agent's reply, model and token counts go in the same step (``message``,
``model_name``, ``metrics``), with its token ids and log-probabilities when they were captured;
the calls an agent inside the sandbox made through the model gateway go in ``extra.model_calls``
of their step (:mod:`envs.spaces.tokens`). Sizes are capped so one episode cannot fill the
disk: each observation keeps its head and tail (:data:`MAX_OBSERVATION_CHARS`),
at most :data:`MAX_STEPS` steps are written, and ``extra.truncated`` says what
was cut.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from envs.spaces.actions import SUBMIT
from envs.spaces.tokens import attach_model_calls
from pool.egress.models.tokens import atif_metrics

SCHEMA_VERSION = "ATIF-v1.4"
MAX_OBSERVATION_CHARS = 16 * 1024
"""Characters of an observation (or an action) kept; longer ones keep their head and tail."""
MAX_STEPS = 1000
"""Steps written per trajectory; the rest are counted in ``final_metrics.total_steps``."""


@dataclass(slots=True)
class Trajectory:
    """Builds one episode's ATIF trajectory as it is played."""

    instruction: str
    tool: str = "shell"
    """The tool an action calls: ``shell`` (Shell-v0) or ``python`` (Python-v0)."""
    steps: list[dict[str, Any]] = field(default_factory=list)
    total_steps: int = 0
    cut_observations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    counted_tokens: bool = False
    ended: list[float] = field(default_factory=list)
    """When each written step ended (Unix time): the model gateway's calls are placed by it."""

    def add(self, action: str, observation: dict[str, Any], info: dict[str, Any], turn: dict[str, Any] | None) -> None:
        """One played action: what the agent did, what it saw, and (for a model agent) its turn."""
        self.total_steps += 1
        turn = turn or {}
        if turn.get("prompt_tokens") is not None or turn.get("completion_tokens") is not None:
            self.counted_tokens = True
            self.prompt_tokens += int(turn.get("prompt_tokens") or 0)
            self.completion_tokens += int(turn.get("completion_tokens") or 0)
        if self.total_steps > MAX_STEPS:
            return
        call_id = f"call_{self.total_steps}"
        output = self._capped(str(observation.get("output", "")))
        call: dict[str, Any] = {"tool_call_id": call_id, "function_name": "submit", "arguments": {}}
        if action != SUBMIT:
            call.update(function_name=self.tool, arguments={"command": self._capped(action)})
        step: dict[str, Any] = {
            "step_id": self.total_steps + 1,  # step 1 is the instruction
            "timestamp": _now(),
            "source": "agent",
            "message": str(turn.get("message") or ""),
            "tool_calls": [call],
            "observation": {"results": [{"source_call_id": call_id, "content": output}]},
            "extra": {
                "exit_code": _int(observation.get("exit_code")),
                "exec_duration_s": info.get("exec_duration_s"),
                "timed_out": bool(info.get("timed_out", False)),
            },
        }
        if turn.get("model_name"):
            step["model_name"] = turn["model_name"]
        metrics = {k: int(turn[k]) for k in ("prompt_tokens", "completion_tokens") if turn.get(k) is not None}
        if isinstance(turn.get("tokens"), dict):
            metrics.update(atif_metrics(turn["tokens"]))
        if metrics:
            step["metrics"] = metrics
        self.steps.append(step)
        self.ended.append(time.time())

    def as_atif(
        self,
        *,
        session_id: str,
        agent: str,
        env_id: str,
        model_name: str | None = None,
        model_calls: Sequence[Mapping[str, Any]] = (),
    ) -> dict[str, Any]:
        """The ATIF document; ``model_calls`` (the network audit's, ``ModelCall.as_dict``) with a token
        record are placed in their steps' ``extra.model_calls``."""
        final: dict[str, Any] = {"total_steps": self.total_steps}
        if self.counted_tokens:
            final.update(total_prompt_tokens=self.prompt_tokens, total_completion_tokens=self.completion_tokens)
        agent_info: dict[str, Any] = {"name": agent, "version": "snapgym"}
        if model_name:
            agent_info["model_name"] = model_name
        truncated = {}
        if self.total_steps > MAX_STEPS:
            truncated["steps_not_written"] = self.total_steps - MAX_STEPS
        if self.cut_observations:
            truncated["texts_cut"] = self.cut_observations
        instruction = {"step_id": 1, "source": "user", "message": self.instruction}
        steps = [dict(step) for step in self.steps]
        if any(isinstance(call.get("tokens"), Mapping) for call in model_calls):
            steps = [{**step, "extra": dict(step.get("extra") or {})} for step in steps]
            attach_model_calls(steps, self.ended, model_calls)
        return {
            "schema_version": SCHEMA_VERSION,
            "session_id": session_id,
            "agent": agent_info,
            "steps": [instruction, *steps],
            "final_metrics": final,
            "extra": {"env_id": env_id, **({"truncated": truncated} if truncated else {})},
        }

    def _capped(self, text: str) -> str:
        if len(text) <= MAX_OBSERVATION_CHARS:
            return text
        self.cut_observations += 1
        half = MAX_OBSERVATION_CHARS // 2
        return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
