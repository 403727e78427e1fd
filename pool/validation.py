"""Checks that settings share: a name from a fixed set, numbers above zero.

Each check raises :class:`~pool.errors.ConfigError` saying which value is wrong
and what would do, so every settings dataclass words the same mistake the same way.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TypeVar

from pool.errors import ConfigError

E = TypeVar("E", bound=enum.Enum)


def choose(kind: type[E], value: object, *, what: str, fold_case: bool = False) -> E:
    """The member of ``kind`` whose value is ``value`` written as a string (a member is itself).

    Args:
        kind: the enum to choose from.
        value: a member, or its value as written in a config.
        what: what the value is, for the message (``"network mode"``).
        fold_case: match the value in lower case (``"Strict"`` is ``strict``).

    Raises:
        ConfigError: no member has that value; the message lists those that do.
    """
    if isinstance(value, kind):
        return value
    text = str(value)
    try:
        return kind(text.lower() if fold_case else text)
    except ValueError:
        valid = ", ".join(str(member.value) for member in kind)
        raise ConfigError(f"unknown {what} {value!r}; choose one of: {valid}") from None


def require_positive(settings: object, names: Iterable[str], *, what: str) -> None:
    """Check that each named attribute of ``settings`` is above zero.

    Args:
        settings: the settings value (a dataclass, in its ``__post_init__``).
        names: the attributes to check, in the order they are reported.
        what: what they are, for the message (``"egress proxy limit"``).

    Raises:
        ConfigError: the first that is not, with its value.
    """
    for name in names:
        value = getattr(settings, name)
        if not value > 0:
            raise ConfigError(f"{what} {name} must be positive, got {value!r}")
