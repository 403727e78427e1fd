"""Where an environment is in its life, and the checks each call makes of it."""

from __future__ import annotations

import enum

from envs.errors import ResetNeededError


class EpisodeState(enum.Enum):
    """Where an environment is in its life."""

    NEEDS_RESET = "needs_reset"
    RUNNING = "running"
    ENDED = "ended"
    CLOSED = "closed"


def check_not_closed(state: EpisodeState) -> None:
    """Raise ResetNeededError on a closed environment."""
    if state is EpisodeState.CLOSED:
        raise ResetNeededError("the environment is closed; make a new one")


def check_running(state: EpisodeState) -> None:
    """Raise ResetNeededError unless an episode is running."""
    check_not_closed(state)
    if state is EpisodeState.NEEDS_RESET:
        raise ResetNeededError("call reset() before step()")
    if state is EpisodeState.ENDED:
        raise ResetNeededError("the episode has ended (terminated or truncated); call reset() to start another")
