"""An agent backed by any OpenAI-compatible chat model.

The conversation: a system prompt saying how to act, the task's instruction,
then, per step, the model's reply and the observation it produced. The
model's reply becomes an action: the last fenced code block in it, or, when
there is none, the whole reply; a reply that is just ``submit`` ends the
episode. The API key is read from the environment variable the config
names, in this process only: nothing but the extracted action reaches the
sandbox, and the key is never written to the ledger or the config dump.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from benchmarks.agents.base import AgentError, EpisodeContext, Observation
from benchmarks.agents.calls import Calls
from benchmarks.agents.chat import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT_S,
    ChatEndpoint,
    EndpointProbe,
    Message,
    complete,
)
from envs.spaces.actions import SUBMIT
from pool.errors import ConfigError

SYSTEM_PROMPT = """You are operating a Linux machine to complete a task.
Each of your replies is run as one action and you will see its output.
{action_kind}
Put the action in one fenced code block. Reply with exactly `submit` when the task is done."""
SHELL_ACTIONS = "An action is a bash command (cd and exported variables persist between actions)."
PYTHON_ACTIONS = "An action is Python source, run in one persistent interpreter (variables persist)."
_ROLES = ("system", "user", "assistant")
_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


class LLMAgent:
    """Asks a chat model for each action.

    Args:
        base_url: the endpoint's base URL (``.../v1``).
        model: the model name.
        api_key_env: the environment variable holding the key; empty for servers without auth.
        temperature: sampling temperature (group rollouts want > 0).
        max_tokens: cap on each reply.
        max_observation_chars: observations are cut to their head and tail beyond this.
        timeout_s: per request, see ``benchmarks.agents.chat``.
        max_retries: per request, see ``benchmarks.agents.chat``.
        capture_tokens: ask the server for each reply's token ids and log-probabilities (vLLM, SGLang); the
            episode's trajectory and ``agent/tokens.jsonl`` keep them.

    Raises:
        ConfigError: the key's variable is named but not set (raised before any sandbox starts).
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        temperature: float = 0.0,
        max_tokens: int = 1024,
        max_observation_chars: int = 8000,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        capture_tokens: bool = False,
    ) -> None:
        self.name = f"llm:{model}"
        self.model = model
        self.whole_task_steps = False
        key = os.environ.get(api_key_env) if api_key_env else None
        if api_key_env and not key:
            raise ConfigError(
                f"agent=llm reads its API key from ${api_key_env}, which is not set; export it, "
                "or set agent.api_key_env='' for a server without authentication"
            )
        self._endpoint = ChatEndpoint(
            base_url, model, key, timeout_s=timeout_s, max_retries=max_retries, capture_tokens=capture_tokens
        )
        self._calls = Calls()
        self._params = {"temperature": temperature, "max_tokens": max_tokens}
        self.max_observation_chars = max_observation_chars

    def endpoint_probe(self) -> EndpointProbe:
        """The runner's health probe of this agent's endpoint (an outage of the model pauses the run)."""
        return EndpointProbe(self._endpoint, self._calls)

    def cut_calls(self) -> None:
        """The run is stopping: the model requests in flight fail now, and new ones at once (until
        :meth:`allow_calls`), so no episode waits out a request's timeout."""
        self._calls.cut()

    def allow_calls(self) -> None:
        """A run begins: model requests go through."""
        self._calls.allow()

    def start(self, episode: EpisodeContext) -> _ChatPolicy:
        """A conversation for one episode."""
        kind = PYTHON_ACTIONS if episode.env_id.endswith("Python-v0") else SHELL_ACTIONS
        messages: list[Message] = [
            {"role": "system", "content": SYSTEM_PROMPT.format(action_kind=kind)},
            {"role": "user", "content": episode.task.instruction},
        ]
        params = {**self._params, "seed": episode.seed}
        return _ChatPolicy(self._endpoint, messages, params, self.max_observation_chars, self._calls)

    def resume(self, episode: EpisodeContext, state: Mapping[str, Any]) -> _ChatPolicy:
        """The conversation as it stood at a checkpoint (``state["messages"]``), going on from there.

        Raises:
            AgentError: the messages are not a conversation this agent began for this episode.
        """
        policy = self.start(episode)
        messages, replied = state.get("messages"), state.get("replied")
        if not isinstance(messages, list) or not isinstance(replied, bool) or messages[:2] != policy.messages:
            raise AgentError("the saved conversation does not begin with this episode's prompt and instruction")
        for message in messages:
            if not (
                isinstance(message, dict) and message.get("role") in _ROLES and isinstance(message.get("content"), str)
            ):
                raise AgentError(f"a saved message must have a role in {_ROLES} and text content, got {message!r:.200}")
        policy.messages[:] = [{"role": m["role"], "content": m["content"]} for m in messages]
        policy.replied = replied
        return policy


class _ChatPolicy:
    def __init__(
        self, endpoint: ChatEndpoint, messages: list[Message], params: dict[str, Any], limit: int, calls: Calls
    ) -> None:
        self._endpoint = endpoint
        self._calls = calls
        self.messages = messages
        self._params = params
        self._limit = limit
        self.replied = False
        self.last_turn: dict[str, Any] | None = None
        """The last reply, its model, token counts and captured tokens (the runner writes them into the trajectory)."""

    def act(self, observation: Observation, info: dict[str, Any]) -> str:
        if self.replied:
            self.messages.append({"role": "user", "content": clip(str(observation["output"]), self._limit)})
        reply = complete(self._endpoint, self.messages, calls=self._calls, **self._params)
        self.replied = True
        self.messages.append({"role": "assistant", "content": reply.content})
        self.last_turn = {
            "message": reply.content, "model_name": self._endpoint.model,
            "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            **({"tokens": reply.tokens} if reply.tokens is not None else {}),
        }  # fmt: skip
        return action_from_reply(reply.content)

    def state(self) -> dict[str, Any]:
        return {"messages": [dict(message) for message in self.messages], "replied": self.replied}


def action_from_reply(reply: str) -> str:
    """The action in a model's reply: ``submit``, else the last fenced block, else the reply itself."""
    reply = reply.replace("\r\n", "\n")
    text = reply.strip()
    if text.strip("`").strip().lower() == SUBMIT:
        return SUBMIT
    blocks = _FENCE.findall(reply)
    if blocks:
        block: str = blocks[-1].strip("\n")
        return SUBMIT if block.strip().lower() == SUBMIT else block
    return text


def clip(text: str, limit: int) -> str:
    """``text`` cut to its head and tail when longer than ``limit`` characters."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = len(text) - (limit - head)  # slicing from here, not text[-n:], keeps nothing when n == 0
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[tail:]}"
