"""The episode ledger: an append-only JSONL file where every scheduled episode ends exactly once.

Each line is one record, written with a single ``write`` to a file opened
``O_APPEND`` and ``fsync``-ed before :meth:`Ledger.append` returns, so a record
the runner moved past is on disk. Kinds of record:

- ``attempt``: an attempt of an episode started (``attempt`` counts from 1,
  ``attempt_id`` is ``<episode_id>/<attempt>``).
- ``attempt_failed``: that attempt hit an infrastructure failure and will be
  retried under a new attempt id; or, found unfinished when a run resumes, it
  was cut short by the runner's death (``interrupted: true``).
- ``result``: the episode's one terminal record (its reward, or a failure
  class and the error). Nothing is appended for an episode after it.

A runner killed mid-write leaves at most a torn last line; :func:`Ledger.open`
cuts it off, so the file is again a sequence of whole records.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pool.errors import ConfigError

LEDGER_FILE = "ledger.jsonl"
ATTEMPT = "attempt"
ATTEMPT_FAILED = "attempt_failed"
RESULT = "result"


def attempt_id(episode_id: str, attempt: int) -> str:
    """The id of one attempt of an episode."""
    return f"{episode_id}/{attempt}"


@dataclass(slots=True)
class LedgerState:
    """What a ledger says about the episodes in it."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    """episode_id -> its terminal record."""
    attempts: dict[str, int] = field(default_factory=dict)
    """episode_id -> the highest attempt number started."""
    unfinished: dict[str, int] = field(default_factory=dict)
    """episode_id -> attempt started with neither a failure nor a result after it."""
    failures: dict[str, int] = field(default_factory=dict)
    """episode_id -> attempts that failed on infrastructure (interrupted ones not counted)."""

    def observe(self, record: Mapping[str, Any]) -> None:
        """Fold one record into the state."""
        episode = str(record["episode_id"])
        kind = record["kind"]
        if kind == ATTEMPT:
            self.attempts[episode] = max(self.attempts.get(episode, 0), int(record["attempt"]))
            self.unfinished[episode] = int(record["attempt"])
        elif kind in (ATTEMPT_FAILED, RESULT):
            self.unfinished.pop(episode, None)
            if kind == ATTEMPT_FAILED and not record.get("interrupted"):
                self.failures[episode] = self.failures.get(episode, 0) + 1
            if kind == RESULT:
                self.results[episode] = dict(record)


class Ledger:
    """An append-only, fsync-ed record of a run's episodes; safe to share between threads.

    Use :meth:`open`, which also reads back what an earlier (possibly killed)
    run of the same directory recorded.
    """

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self.state = LedgerState()
        self._fsync = fsync
        self._lock = threading.Lock()
        self._fd: int | None = None

    @classmethod
    def open(cls, run_dir: Path, *, fsync: bool = True) -> Ledger:
        """Open (or create) ``run_dir/ledger.jsonl``, cut a torn last line, and load its state."""
        run_dir.mkdir(parents=True, exist_ok=True)
        ledger = cls(run_dir / LEDGER_FILE, fsync=fsync)
        if ledger.path.exists():
            _cut_torn_tail(ledger.path)
            for record in read_records(ledger.path):
                ledger.state.observe(record)
        ledger._fd = os.open(ledger.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return ledger

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record durably.

        Raises:
            ConfigError: a second ``result`` for an episode (a bug in the caller:
                the ledger refuses it instead of double-counting).
        """
        line = (json.dumps(record, ensure_ascii=False, default=str, allow_nan=False) + "\n").encode()
        with self._lock:
            if self._fd is None:
                raise ConfigError("the ledger is closed")
            if record["kind"] == RESULT and record["episode_id"] in self.state.results:
                raise ConfigError(f"episode {record['episode_id']} already has a result; refusing a second one")
            os.write(self._fd, line)
            if self._fsync:
                os.fsync(self._fd)
            self.state.observe(record)

    def close(self) -> None:
        """Close the file. Idempotent."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """The whole records of a ledger file, in order (a torn last line is skipped)."""
    with path.open("rb") as file:
        for raw in file:
            if not raw.endswith(b"\n"):
                return
            yield json.loads(raw)


def read_results(run_dir: Path) -> list[dict[str, Any]]:
    """The terminal records of a run directory's ledger, in the order they were written."""
    path = run_dir / LEDGER_FILE
    if not path.exists():
        return []
    return [record for record in read_records(path) if record["kind"] == RESULT]


def _cut_torn_tail(path: Path) -> None:
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with path.open("r+b") as file:
            file.truncate(end)
