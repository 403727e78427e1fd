"""The agent's clock of an episode: the task's ``agent_timeout_s`` is measured on it.

It runs from ``reset()`` (or, for a resumed episode, from the time already used) and stands
still while the environment itself works for the agent (a checkpoint).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class AgentClock:
    """Seconds of an episode on the clock of the task's agent time budget."""

    def __init__(self) -> None:
        self._started = time.monotonic()

    def start(self, used_s: float = 0.0) -> None:
        """Start an episode that has used ``used_s`` already."""
        self._started = time.monotonic() - used_s

    @property
    def elapsed_s(self) -> float:
        """Seconds used so far."""
        return time.monotonic() - self._started

    def is_over(self, limit_s: float | None) -> bool:
        """Whether the budget (None: none) is used up."""
        return limit_s is not None and self.elapsed_s >= limit_s

    def cap(self, timeout_s: float, limit_s: float | None) -> float:
        """``timeout_s``, cut to what is left of the budget (at least one second)."""
        return timeout_s if limit_s is None else max(1.0, min(timeout_s, limit_s - self.elapsed_s))

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Do not count the time of the ``with`` block."""
        started = time.monotonic()
        try:
            yield
        finally:
            self._started += time.monotonic() - started
