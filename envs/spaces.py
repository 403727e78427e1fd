"""Gymnasium spaces for what agents type and what commands print."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

_SAMPLE_CHARSET = "abcdefghijklmnopqrstuvwxyz0123456789 -_./"


class UnicodeText(spaces.Text):
    """Any Unicode string of at most ``max_length`` characters, without NUL.

    ``spaces.Text`` only holds strings over a fixed character set, which real
    command output (any byte, decoded with replacement characters) does not
    respect. This space accepts every such string; :meth:`sample` draws short
    harmless ASCII strings so that environment checkers can exercise it.
    The vector utilities treat it like ``Text`` (batches are tuples).
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        """True for a str of allowed length with no NUL character."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length and "\0" not in x

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A short string of lowercase letters, digits and a few punctuation marks."""
        length = int(self.np_random.integers(max(self.min_length, 1), min(self.max_length, 24) + 1))
        picks = self.np_random.integers(0, len(_SAMPLE_CHARSET), size=length)
        return "".join(_SAMPLE_CHARSET[i] for i in picks)

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    __hash__ = None  # type: ignore[assignment]
