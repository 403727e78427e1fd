"""The asynchronous API: many episodes on one event loop, without a thread per episode.

>>> env = envs.aio.AsyncEnv(envs.ShellEnv("log-error-count"))
>>> obs, info = await env.reset()
>>> obs, reward, terminated, truncated, info = await env.step("ls")
>>> groups = await envs.aio.rollout(envs.ShellEnv(tasks=[...]), policy, k=8, max_in_flight=64)

See docs/environments.md ("Asynchronous episodes") for which parts wait on the loop and which run on
the small shared executor of :mod:`envs.aio.blocking`.
"""

from __future__ import annotations

from envs.aio.blocking import Blocking, shared
from envs.aio.env import AsyncEnv
from envs.aio.rollout import AsyncPolicy, rollout

__all__ = ["AsyncEnv", "AsyncPolicy", "Blocking", "rollout", "shared"]
