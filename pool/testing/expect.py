"""The conformance suite's failure: :class:`ConformanceError`, and :func:`expect` that raises it."""

from __future__ import annotations


class ConformanceError(AssertionError):
    """A backend broke the sandbox contract; the message names the check."""


def expect(condition: bool, check: str, detail: str = "") -> None:
    """Raise :class:`ConformanceError` naming ``check`` (and ``detail``) unless ``condition`` holds."""
    if not condition:
        raise ConformanceError(f"{check}: {detail}" if detail else check)
