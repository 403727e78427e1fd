"""Your own agent: ``agent=python agent.target=my_pkg.my_agent:MyAgent`` (or ``path/to/file.py:MyAgent``).

The class is imported in the runner's process, outside every sandbox, and built
with ``agent.kwargs`` as keywords, before any sandbox starts: a target that does
not import, names no class, or names a class without a ``start`` method stops
the run with one line. It implements the same protocol as the built-in agents
(``benchmarks.agents.base``): ``start(episode) -> policy`` and, for episodes
that survive a crash of the runner (``checkpoint_every``), ``resume(episode,
state) -> policy`` with the policy's ``state()``. ``name`` (the ledger's
``agent``; default: the class's name) and ``whole_task_steps`` (default False)
are optional.

A dotted module is imported from the directory the run was started in (put on
``sys.path``, as Harbor's ``--agent-import-path`` does) and from ``sys.path``; a
file path is imported as a module named after the file, with the file's folder on
``sys.path`` so it can import its neighbours.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.agents.base import EpisodeContext, Observation
from pool.errors import ConfigError

REQUIRED = ("start",)
"""The methods an agent must have (``resume`` is optional: it makes the agent's episodes durable)."""


def python_agent(*, target: str, kwargs: Mapping[str, Any] | None = None, name: str = "python") -> UserAgent:
    """The agent ``target`` names, built with ``kwargs`` (``make_agent``'s factory for ``agent=python``).

    Raises:
        ConfigError: the target is malformed, does not import, names no class, names a class without
            the protocol's methods, or the class refuses ``kwargs``.
    """
    cls = load_class(target)
    options = dict(kwargs or {})
    try:
        inspect.signature(cls).bind(**options)
    except TypeError as exc:
        raise ConfigError(f"agent.kwargs {options} do not fit {cls.__name__}{_signature(cls)}: {exc}") from None
    except ValueError:  # no signature to check (a builtin): the call says it
        pass
    try:
        instance = cls(**options)
    except Exception as exc:
        raise ConfigError(f"{cls.__name__}(**agent.kwargs) failed: {type(exc).__name__}: {_line(exc)}") from None
    label = getattr(instance, "name", None)
    label = label if isinstance(label, str) and label else cls.__name__
    whole = getattr(instance, "whole_task_steps", False)
    if not isinstance(whole, bool):
        raise ConfigError(f"{cls.__name__}.whole_task_steps must be True or False, got {whole!r}")
    kind = ResumableUserAgent if callable(getattr(instance, "resume", None)) else UserAgent
    return kind(instance, label, whole)


def load_class(target: str) -> type[Any]:
    """The class ``module:Class`` or ``path/to/file.py:Class`` names.

    Raises:
        ConfigError: the target is malformed, does not import, names no class, or names a class
            without the protocol's methods.
    """
    where, _, attribute = target.rpartition(":")
    if not where or not attribute:
        raise ConfigError(
            f"agent.target must be module:Class or path/to/file.py:Class, got {target!r} "
            "(e.g. agent.target=my_pkg.my_agent:MyAgent)"
        )
    module = _import_file(where) if where.endswith(".py") or os.sep in where or "/" in where else _import(where)
    found = getattr(module, attribute, None)
    if found is None:
        classes = sorted(n for n, v in vars(module).items() if inspect.isclass(v) and v.__module__ == module.__name__)
        close = difflib.get_close_matches(attribute, classes, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        listed = f"its classes: {', '.join(classes)}" if classes else "it defines no class"
        raise ConfigError(f"agent.target {target!r}: {where} has no {attribute!r}; {hint}{listed}")
    if not inspect.isclass(found):
        raise ConfigError(f"agent.target {target!r}: {attribute} is a {type(found).__name__}, not a class")
    missing = [method for method in REQUIRED if not callable(getattr(found, method, None))]
    if missing:
        raise ConfigError(
            f"agent.target {target!r}: class {attribute} has no {', '.join(missing)}() method; an agent needs "
            "start(self, episode) -> policy, the policy act(self, observation, info) -> action (docs/agents.md)"
        )
    return found


def _import(dotted: str) -> ModuleType:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (dotted + ".").startswith(exc.name + "."):  # the target, not its imports
            raise ConfigError(
                f"agent.target: no module named {exc.name!r} importable from {cwd} or sys.path; run from the folder "
                f"that holds it, add that folder to PYTHONPATH, or give a file: agent.target=path/to/file.py:Class"
            ) from None
        raise ConfigError(f"agent.target: importing {dotted} failed: {type(exc).__name__}: {_line(exc)}") from None
    except Exception as exc:
        raise ConfigError(f"agent.target: importing {dotted} failed: {type(exc).__name__}: {_line(exc)}") from None


def _import_file(location: str) -> ModuleType:
    path = Path(location).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"agent.target: no file {path} (from {location!r}, relative to {os.getcwd()})")
    name = f"snapgym_agent_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"agent.target: {path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(f"agent.target: importing {path} failed: {type(exc).__name__}: {_line(exc)}") from None
    return module


def _signature(cls: type[Any]) -> str:
    try:
        return str(inspect.signature(cls))
    except ValueError:
        return "(...)"


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or "(no message)"


class UserAgent:
    """A user's agent as the runner plays it: its ``start``, under its ``name``."""

    def __init__(self, inner: Any, name: str, whole_task_steps: bool) -> None:
        self.inner = inner
        self.name = name
        self.whole_task_steps = whole_task_steps

    def start(self, episode: EpisodeContext) -> Any:
        """The user's policy for one episode."""
        return self.inner.start(episode)


class ResumableUserAgent(UserAgent):
    """A user's agent that declares its state: its episodes go on from a checkpoint after a crash."""

    def start(self, episode: EpisodeContext) -> Any:
        """The user's policy; one without ``state()`` gets a checkpoint that fails (and says why)."""
        return _savable(self.inner.start(episode))

    def resume(self, episode: EpisodeContext, state: Mapping[str, Any]) -> Any:
        """The user's policy rebuilt from ``state``; it raises ``AgentError`` for a state it did not write."""
        return _savable(self.inner.resume(episode, state))


def _savable(policy: Any) -> Any:
    return policy if callable(getattr(policy, "state", None)) else _Stateless(policy)


class _Stateless:
    """A policy whose agent has ``resume`` but which has no ``state()``: its checkpoints fail, named."""

    def __init__(self, policy: Any) -> None:
        self._policy = policy

    def act(self, observation: Observation, info: dict[str, Any]) -> str:
        action: str = self._policy.act(observation, info)
        return action

    def state(self) -> dict[str, Any]:
        raise TypeError(
            f"{type(self._policy).__name__} has no state() method, so its agent's resume() gets nothing to go on "
            "from; add state() returning JSON-ready values (docs/agents.md)"
        )

    def __getattr__(self, name: str) -> Any:  # last_turn, files
        return getattr(self._policy, name)
