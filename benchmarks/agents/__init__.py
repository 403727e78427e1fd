"""Agents the runner can play episodes with: ``oracle``, ``noop``, ``replay``, ``llm``, ``python`` (your own
class; all outside the sandbox) and ``installed`` (a CLI agent inside it: ``agent=claude-code``, ``agent=codex``).

>>> from benchmarks.agents import make_agent
>>> agent = make_agent({"name": "noop", "steps": 0})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from benchmarks.agents.base import (
    Agent,
    AgentError,
    EpisodeContext,
    ModelRequestError,
    ModelUnavailableError,
    Observation,
    Policy,
    SavablePolicy,
)
from benchmarks.agents.imported import python_agent
from benchmarks.agents.installed import InstalledAgent
from benchmarks.agents.llm import LLMAgent
from benchmarks.agents.noop import NoopAgent
from benchmarks.agents.oracle import OracleAgent
from benchmarks.agents.replay import ReplayAgent
from pool.errors import ConfigError

AGENTS: dict[str, Callable[..., Any]] = {
    "oracle": OracleAgent,
    "noop": NoopAgent,
    "replay": ReplayAgent,
    "llm": LLMAgent,
    "installed": InstalledAgent,
    "python": python_agent,
}


def make_agent(options: Mapping[str, Any]) -> Agent:
    """The agent named by ``options["name"]``, built with the other keys as keywords.

    Raises:
        ConfigError: an unknown name or options the agent refuses.
    """
    options = dict(options)
    name = options.pop("name")
    try:
        factory = AGENTS[name]
    except KeyError:
        raise ConfigError(f"unknown agent {name!r}; choose one of: {', '.join(AGENTS)}") from None
    agent: Agent = factory(**options)
    return agent


__all__ = [
    "AGENTS",
    "Agent",
    "AgentError",
    "EpisodeContext",
    "InstalledAgent",
    "LLMAgent",
    "ModelRequestError",
    "ModelUnavailableError",
    "NoopAgent",
    "Observation",
    "OracleAgent",
    "Policy",
    "ReplayAgent",
    "SavablePolicy",
    "make_agent",
]
