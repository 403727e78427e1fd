"""The journal of a durable episode: what a resumed run needs to go on from the last checkpoint.

With ``checkpoint_every=k``, each attempt of an episode appends JSON lines to
``episodes/<task>/<sample>-journal.jsonl``:

- ``start``: the attempt began at the task's snapshot, with the start's provenance (snapshot id,
  start digest, sandbox, reset latency), which a resumed attempt's result keeps;
- ``resumed``: the attempt began at the last checkpoint instead;
- ``step``: one played step, as the trajectory writes it;
- ``checkpoint``: after every k-th step, the sandbox checkpoint (a ``Snapshot``), the agent's
  declared state, the clocks and counts, and the episode's changes so far; written with fsync,
  so it is on disk before the next step is played;
- ``checkpoint_failed``: a checkpoint could not be taken (the episode goes on);
- ``end``: the attempt ended, with its outcome.

A runner killed mid-episode leaves an attempt without ``end``. The next run reads the journal
back: the last checkpoint of the chain of attempts that led to it, and the steps up to it. A
torn last line (the kill came mid-write) is skipped. The journal lives in the run directory,
outside every sandbox: the agent can neither read nor edit it.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

START, RESUMED, STEP, CHECKPOINT, CHECKPOINT_FAILED, END = (
    "start", "resumed", "step", "checkpoint", "checkpoint_failed", "end",
)  # fmt: skip
RESUMABLE_ENDS = ("infra_error",)
"""Outcomes after which the next attempt may go on from the last checkpoint (besides a runner that died)."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One journalled checkpoint: everything a resumed attempt starts from."""

    attempt: int
    step: int
    """Steps taken when it was made."""
    snapshot: dict[str, Any]
    """The sandbox checkpoint (``Snapshot.to_dict()``)."""
    agent_state: dict[str, Any]
    """What the agent's policy declared (``SavablePolicy.state()``)."""
    elapsed_s: float
    """Seconds used of the task's agent time (the environment's clock)."""
    episode_s: float
    """Seconds of the episode on the runner's clock (``episode_timeout_s``)."""
    agent_s: float
    env_s: float
    changes: dict[str, Any] | None
    """The episode's changes so far, against the task's snapshot."""
    trajectory: dict[str, Any]
    """The trajectory's counts (its steps are journalled one by one)."""
    observation: dict[str, Any]
    """What the step showed the agent (``output``, ``exit_code``), which its next action answers."""
    info: dict[str, Any]
    """The step's info, as the agent saw it (JSON values)."""


@dataclass(slots=True)
class JournalState:
    """What the journal says about an episode whose last attempt did not finish cleanly."""

    attempt: int | None = None
    """The last attempt journalled."""
    ended: str | None = None
    """How it ended (None: the runner stopped during it)."""
    steps_reached: int = 0
    """Steps that attempt (with the attempts it went on from) had played."""
    start: dict[str, Any] = field(default_factory=dict)
    """The provenance of the episode's start (the task's snapshot)."""
    checkpoint: Checkpoint | None = None
    """The last checkpoint of its chain."""
    steps: list[dict[str, Any]] = field(default_factory=list)
    """The trajectory's steps up to the checkpoint."""

    @property
    def can_go_on(self) -> bool:
        """Whether the next attempt may start at the checkpoint: there is one, and the last attempt
        was cut short (the runner died) or failed on infrastructure."""
        return self.checkpoint is not None and (self.ended is None or self.ended in RESUMABLE_ENDS)


class EpisodeJournal:
    """Appends to and reads one episode's journal file.

    Args:
        path: the journal file (made with its folder on the first write).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tail_checked = False

    def start(self, attempt: int, provenance: dict[str, Any]) -> None:
        """The attempt began at the task's snapshot."""
        self._append({"type": START, "attempt": attempt, "provenance": provenance})

    def resumed(self, attempt: int, checkpoint: Checkpoint) -> None:
        """The attempt began at ``checkpoint``."""
        self._append({"type": RESUMED, "attempt": attempt, "from_attempt": checkpoint.attempt, "step": checkpoint.step})

    def step(self, attempt: int, step: int, entry: dict[str, Any] | None) -> None:
        """One played step (``entry``: the trajectory's record of it, None past the trajectory's cap)."""
        self._append({"type": STEP, "attempt": attempt, "step": step, "entry": entry})

    def checkpoint(self, checkpoint: Checkpoint) -> None:
        """A checkpoint, on disk before this returns."""
        self._append({"type": CHECKPOINT, **asdict(checkpoint)}, sync=True)

    def checkpoint_failed(self, attempt: int, step: int, error: str) -> None:
        """A checkpoint could not be taken."""
        self._append({"type": CHECKPOINT_FAILED, "attempt": attempt, "step": step, "error": error})

    def end(self, attempt: int, outcome: str) -> None:
        """The attempt ended."""
        self._append({"type": END, "attempt": attempt, "outcome": outcome}, sync=True)

    def load(self) -> JournalState:
        """The episode's state by its journal (an empty state when there is none)."""
        state = JournalState()
        steps: dict[int, dict[str, Any]] = {}
        for record in self._records():
            kind, attempt = record.get("type"), record.get("attempt")
            if kind == START:
                state = JournalState(attempt=attempt, start=dict(record.get("provenance") or {}))
                steps = {}
            elif kind == RESUMED:
                state.attempt, state.ended = attempt, None
                state.steps_reached = int(record.get("step", 0))
            elif kind == STEP:
                state.steps_reached = int(record["step"])
                steps[int(record["step"])] = record.get("entry") or {}
            elif kind == CHECKPOINT:
                fields = {name: record[name] for name in Checkpoint.__dataclass_fields__}
                state.checkpoint = Checkpoint(**fields)
            elif kind == END:
                state.ended = str(record.get("outcome"))
        if state.checkpoint is not None:
            last = state.checkpoint.step
            state.steps = [steps[n] for n in sorted(steps) if n <= last and steps[n]]
        return state

    def _records(self) -> list[dict[str, Any]]:
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return []
        records = []
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or (record.get("type") == CHECKPOINT and not _complete(record)):
                    raise ValueError("not a journal record")
            except ValueError:
                if number < len(lines):
                    log.warning("%s:%d: not a journal record; skipped", self.path, number)
                continue  # the last line may be torn: the runner was killed while writing it
            records.append(record)
        return records

    def _append(self, record: dict[str, Any], *, sync: bool = False) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if not self._tail_checked:  # a runner killed mid-write left a torn line: end it first
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    data = b"\n" + data
                self._tail_checked = True
            while data:
                data = data[os.write(fd, data) :]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)


def _complete(record: dict[str, Any]) -> bool:
    return all(name in record for name in Checkpoint.__dataclass_fields__)
