"""Where a checkpointed episode goes on: the ``resume_at`` option of ``SandboxEnv.reset``.

A durable runner (see benchmarks.episodes.durable) restores an episode's checkpoint and
tells the environment how far the episode had come, so that the step count,
the task's agent clock and the end-state changes go on from there: a resumed
episode gets no extra steps or time, and its diff is the whole episode's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pool.changes import Changes
from pool.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a checkpointed episode goes on (``reset(options={"resume_at": ...})``)."""

    step: int
    elapsed_s: float
    changes: Changes | None


def resume_point(value: Any, *, has_snapshot: bool, max_steps: int) -> ResumePoint | None:
    """The ``resume_at`` reset option, checked.

    Raises:
        ConfigError: it has no checkpoint to go with, or its fields are not a step count below
            ``max_steps``, a non-negative time and an info-style changes mapping (or None).
    """
    if value is None:
        return None
    if not has_snapshot:
        raise ConfigError("options['resume_at'] needs options['snapshot'], the checkpoint it goes on from")
    if not isinstance(value, Mapping) or set(value) - {"step", "elapsed_s", "changes"}:
        raise ConfigError(f"options['resume_at'] takes step, elapsed_s and changes, got {value!r:.200}")
    step, elapsed, changes = value.get("step"), value.get("elapsed_s", 0.0), value.get("changes")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < max_steps:
        raise ConfigError(f"options['resume_at']['step'] must be a step count in [0, {max_steps}), got {step!r}")
    if not isinstance(elapsed, (int, float)) or isinstance(elapsed, bool) or not 0 <= elapsed < float("inf"):
        raise ConfigError(f"options['resume_at']['elapsed_s'] must be seconds >= 0, got {elapsed!r}")
    if changes is None:
        return ResumePoint(step, float(elapsed), None)
    if not isinstance(changes, Mapping) or "unavailable" in changes:  # the checkpoint's listing failed
        return ResumePoint(step, float(elapsed), Changes("host", truncated=True))  # so the end's is incomplete
    return ResumePoint(step, float(elapsed), Changes.from_dict(dict(changes)))
