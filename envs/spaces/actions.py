"""What an action must be before it runs: text, UTF-8, within the size limit, without NUL; and the one that submits."""

from __future__ import annotations

from typing import Any

from envs.errors import InvalidActionError

SUBMIT = "submit"
"""The action that ends an episode and asks for the verdict."""


def check_action(action: Any, max_action_bytes: int) -> None:
    """Raise :class:`InvalidActionError` unless ``action`` could be run."""
    if not isinstance(action, str):
        raise InvalidActionError(f"an action must be a str, got {type(action).__name__}")
    try:
        size = len(action.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidActionError(
            f"the action is not encodable as UTF-8 (a lone surrogate at position {exc.start}); "
            "decode model output with errors='replace'"
        ) from None
    if size > max_action_bytes:
        raise InvalidActionError(
            f"the action is {size} bytes, over max_action_bytes={max_action_bytes}; "
            "write large content with several commands or raise the limit"
        )
    if "\0" in action:
        raise InvalidActionError("the action contains a NUL character, which no shell or interpreter accepts")
