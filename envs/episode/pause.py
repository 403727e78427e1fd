"""Partial rollouts: an episode paused between steps and resumed later, by another worker.

``env.pause()`` checkpoints the episode's sandbox (as a durable runner does, see
envs.episode.resume), lets the sandbox go, and returns a :class:`PausedEpisode`: a plain,
JSON-serialisable handle that names the checkpoint, the step count, the agent time used and
the changes so far. While paused, the episode is a snapshot, not a live sandbox: nothing can
reach or change it. ``env2.resume(handle)`` (any environment of the same task, in any process
that reaches the same snapshot store) restores the checkpoint and goes on: steps are numbered on
from the pause, the agent clock and the end-state changes continue, and the verifier judges the
whole episode.

A handle resumes exactly once. The claim is a file created with ``O_EXCL`` in the handle's
``claims_dir`` (default ``~/.cache/snapgym/paused``, beside the local backend's store), so two
workers that share that folder (one machine, or a shared file system) cannot both resume it; the
second gets :class:`~envs.errors.AlreadyResumedError`.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.errors import AlreadyResumedError
from pool.errors import ConfigError
from pool.snapshots import Snapshot


def default_claims_dir() -> Path:
    """Where handles are claimed unless told otherwise: ``$XDG_CACHE_HOME/snapgym/paused``."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "snapgym" / "paused"


@dataclass(frozen=True, slots=True)
class PausedEpisode:
    """A paused episode: its checkpoint and how far it had come. Serialise with :meth:`to_json`."""

    id: str
    """Unique per pause; the name of its claim."""
    task_id: str
    snapshot: Snapshot
    """The checkpoint of the sandbox at the pause."""
    step: int
    """Steps taken before the pause; the next one is ``step + 1``."""
    elapsed_s: float
    """Seconds of the task's agent time used."""
    changes: Mapping[str, Any] | None
    """The episode's changes at the pause (info-style), so the end's diff is the whole episode's."""
    claims_dir: str
    """Where the exactly-once claim of a resume is taken."""
    carry: Mapping[str, Any] = field(default_factory=dict)
    """Whatever the caller paused with it (the trajectory so far, a policy's state): JSON values."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values."""
        return {"id": self.id, "task_id": self.task_id, "snapshot": self.snapshot.to_dict(), "step": self.step,
                "elapsed_s": self.elapsed_s, "changes": self.changes, "claims_dir": self.claims_dir,
                "carry": dict(self.carry)}  # fmt: skip

    def to_json(self) -> str:
        """The handle as one JSON document."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PausedEpisode:
        """The handle :meth:`to_dict` wrote.

        Raises:
            ConfigError: a field is missing or of the wrong type.
        """
        try:
            return cls(str(data["id"]), str(data["task_id"]), Snapshot.from_dict(data["snapshot"]), int(data["step"]),
                       float(data["elapsed_s"]), data.get("changes"), str(data["claims_dir"]),
                       dict(data.get("carry") or {}))  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"not a paused episode's handle ({exc!r}); pass what env.pause() returned") from None

    @classmethod
    def from_json(cls, text: str) -> PausedEpisode:
        """The handle :meth:`to_json` wrote."""
        return cls.from_dict(json.loads(text))


def paused(task_id: str, snapshot: Snapshot, *, step: int, elapsed_s: float, changes: Mapping[str, Any] | None,
           claims_dir: str | Path | None, carry: Mapping[str, Any] | None) -> PausedEpisode:  # fmt: skip
    """A new handle (its carry checked to be JSON)."""
    carry = dict(carry or {})
    try:
        json.dumps(carry)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"pause(carry=...) must hold JSON values: {exc}") from None
    where = str(claims_dir) if claims_dir is not None else str(default_claims_dir())
    return PausedEpisode(uuid.uuid4().hex, task_id, snapshot, step, elapsed_s, changes, where, carry)


def claim(handle: PausedEpisode, *, by: str) -> None:
    """Take the handle's one resume.

    Raises:
        AlreadyResumedError: it was claimed before (by this or another worker).
    """
    folder = Path(handle.claims_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{handle.id}.claimed"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        who = path.read_text(errors="replace").strip() or "another worker"
        raise AlreadyResumedError(
            f"paused episode {handle.id} (task {handle.task_id}, step {handle.step}) was resumed already, by {who}; "
            "a handle resumes exactly once: pause the resumed episode again for a new one"
        ) from None
    with os.fdopen(fd, "w") as out:
        out.write(by)


def check_resumable(handle: object, task_ids: Mapping[str, Any]) -> PausedEpisode:
    """The handle, checked before it is claimed.

    Raises:
        ConfigError: not a handle, or its task is not this environment's.
    """
    if isinstance(handle, Mapping):
        handle = PausedEpisode.from_dict(handle)
    if not isinstance(handle, PausedEpisode):
        raise ConfigError(f"resume() takes what pause() returned (a PausedEpisode), got {type(handle).__name__}")
    if handle.task_id not in task_ids:
        raise ConfigError(f"paused episode's task {handle.task_id!r} is not this environment's: {sorted(task_ids)}")
    return handle
