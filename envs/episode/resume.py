"""Where an episode starts: the options of ``SandboxEnv.reset``, and ``resume_at`` in particular.

An episode starts at ``options["snapshot"]``, else at a fork child's fork point, else at the
task's snapshot.

A durable runner (see benchmarks.episodes.recording.durable) restores an episode's checkpoint and
tells the environment how far the episode had come, so that the step count,
the task's agent clock and the end-state changes go on from there: a resumed
episode gets no extra steps or time, and its diff is the whole episode's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pool.changes import Changes
from pool.contract import ReportsReuse, Sandbox
from pool.errors import ConfigError
from pool.snapshots import Snapshot

RESET_OPTIONS = frozenset({"snapshot", "task", "resume_at"})
"""The options ``reset()`` takes."""


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


@dataclass(frozen=True, slots=True)
class Start:
    """Where an episode starts, and how ``info["started_at"]`` names it."""

    target: Snapshot
    started_at: str
    """``task``, ``fork`` (a child of ``fork()``), ``snapshot`` or ``checkpoint`` (resumed)."""
    resume_at: ResumePoint | None


def check_reset_options(options: Mapping[str, Any]) -> None:
    """Refuse options ``reset()`` does not know."""
    unknown = set(options) - RESET_OPTIONS
    if unknown:
        raise ConfigError(f"unknown reset option(s) {sorted(unknown)}; known: {sorted(RESET_OPTIONS)}")


def episode_start(
    options: Mapping[str, Any], *, fork_point: Snapshot | None, task_snapshot: Snapshot, max_steps: int
) -> Start:
    """Where the episode of ``reset(options=options)`` starts."""
    asked = options.get("snapshot")
    target = asked or fork_point or task_snapshot
    started_at = "snapshot" if asked else "fork" if fork_point else "task"
    resume_at = resume_point(options.get("resume_at"), has_snapshot=bool(asked), max_steps=max_steps)
    if not isinstance(target, Snapshot):
        raise ConfigError(f"options['snapshot'] must be a Snapshot (from checkpoint()), got {type(target).__name__}")
    return Start(target, "checkpoint" if resume_at is not None else started_at, resume_at)


def start_info(task_id: str, start: Start, sandbox: Sandbox, backend: str, *, remote: bool) -> dict[str, Any]:
    """The start's part of ``reset()``'s ``info``: what started where, in which sandbox."""
    info: dict[str, Any] = {
        "task_id": task_id,
        "snapshot_id": start.target.id,
        "started_at": start.started_at,
        "start_digest": sandbox.start_digest,
        "sandbox_id": sandbox.id,
        "provider": backend if remote else None,
        "backend": backend,
    }
    if isinstance(sandbox, ReportsReuse):  # kernel objects of a dead instance, each proven clean first
        info["reused"] = dict(sandbox.reused)
    if start.resume_at is not None:
        info["resumed_at_step"] = start.resume_at.step
    if start.target.unapplied:  # what the task asks for that the backend does not hold it to
        info["resources_not_applied"] = list(start.target.unapplied)
    return info
