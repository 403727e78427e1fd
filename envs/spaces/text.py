"""Gymnasium spaces for what agents type and what commands print."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

_SAMPLE_CHARSET = "abcdefghijklmnopqrstuvwxyz0123456789 -_./"


class UnicodeText(spaces.Text):
    """Any UTF-8-encodable string of at most ``max_length`` characters (without NUL, by default).

    ``spaces.Text`` only holds strings over a fixed character set, which real
    command output (any byte, decoded with replacement characters) does not
    respect. This space accepts every such string; :meth:`sample` draws short
    harmless ASCII strings so that environment checkers can exercise it.
    The vector utilities treat it like ``Text`` (batches are tuples).
    """

    def __init__(
        self,
        max_length: int,
        *,
        min_length: int = 0,
        allow_nul: bool = False,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        super().__init__(max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)
        self.allow_nul = allow_nul

    def contains(self, x: Any) -> bool:
        """True for an encodable str of allowed length (with no NUL unless allowed)."""
        if not isinstance(x, str) or not self.min_length <= len(x) <= self.max_length:
            return False
        if not self.allow_nul and "\0" in x:
            return False
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True

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
            and self.allow_nul == other.allow_nul
        )

    __hash__ = None  # type: ignore[assignment]
