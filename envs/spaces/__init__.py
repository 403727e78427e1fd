"""What an agent sends and sees: the actions, the observations, their text space, the trajectory.

- :mod:`~envs.spaces.actions`: what an action must be before it runs, and :data:`SUBMIT`.
- :mod:`~envs.spaces.observations`: the observation space and how a command's result becomes one.
- :mod:`~envs.spaces.text`: :class:`UnicodeText`, a Gymnasium space for any text.
- :mod:`~envs.spaces.trajectory`: an episode's trajectory in ATIF.

Nothing here knows about sandboxes or tasks; the environments build on it. ``from envs.spaces
import UnicodeText`` (the former module) still works.
"""

from __future__ import annotations

from envs.spaces.actions import SUBMIT, check_action
from envs.spaces.observations import NO_COMMAND, TIMED_OUT
from envs.spaces.text import UnicodeText
from envs.spaces.trajectory import Trajectory

__all__ = ["NO_COMMAND", "SUBMIT", "TIMED_OUT", "Trajectory", "UnicodeText", "check_action"]
