"""The episode ledger: an append-only JSONL file where every scheduled episode ends exactly once per pass.

Each line is one record, appended to a file opened ``O_APPEND`` and
``fsync``-ed before :meth:`Ledger.append` returns, so a record the runner
moved past is on disk. Kinds of record:

- ``attempt``: an attempt of an episode started (``attempt`` counts from 1
  over the episode's whole history, ``attempt_id`` is ``<episode_id>/<attempt>``).
- ``attempt_failed``: that attempt hit an infrastructure failure and will be
  retried under a new attempt id. ``interrupted: true``: found unfinished when
  a run resumed (the runner died during it). ``outage: true``: it failed while
  the run's supply or model endpoint was down (see ``benchmarks.episodes.outage``).
  Only failures that are neither count against ``max_attempts``.
- ``result``: the episode's terminal record (its reward, or a failure class
  and the error).
- ``superseded``: the episode's ``result`` named by ``attempt_id`` (an
  ``infra_error``) no longer stands. A resumed run writes one for each episode
  that ended as ``infra_error`` before, then plays the episode again under new
  attempt ids with a fresh ``max_attempts``.

The invariant: a pass over an episode is its records from its first
``attempt`` (or from a ``superseded``) to its ``result``; every pass ends with
exactly one ``result``, and an episode has at most one standing result (one
not followed by a ``superseded``). The ledger refuses a second standing
result. Readers (``results.read_run``, the summary) count each episode once,
by its standing result; the superseded ones stay in the file as history.
``scored``, ``agent_error`` and ``timeout`` results are final: nothing
supersedes them.

Writes never tear the file. A record is written with as many ``write`` calls
as it takes (a write can be short, as on a full disk); if one fails, the file
is cut back to the last whole record and :class:`LedgerWriteError` says what
failed and what to do, and the ledger refuses further records, so the run
stops with a ledger it can resume. A runner killed mid-write leaves at most a
torn last line; :meth:`Ledger.open` cuts it off (with a warning naming its
size), so the file is again a sequence of whole records.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pool.errors import ConfigError, SnapgymError

LEDGER_FILE = "ledger.jsonl"
ATTEMPT = "attempt"
ATTEMPT_FAILED = "attempt_failed"
RESULT = "result"
SUPERSEDED = "superseded"
KINDS = (ATTEMPT, ATTEMPT_FAILED, RESULT, SUPERSEDED)

log = logging.getLogger(__name__)


class LedgerWriteError(SnapgymError, OSError):
    """A record could not be written to the ledger (a full disk, an I/O error); the run must stop."""


class LedgerCorruptError(SnapgymError, ValueError):
    """A line before the ledger's last one is not a whole record."""


class LedgerInUseError(SnapgymError, BlockingIOError):
    """Another runner is writing this run (two runners on one ledger would play episodes twice)."""


def attempt_id(episode_id: str, attempt: int) -> str:
    """The id of one attempt of an episode."""
    return f"{episode_id}/{attempt}"


@dataclass(slots=True)
class LedgerState:
    """What a ledger says about the episodes in it."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    """episode_id -> its standing terminal record (superseded ones are gone from here)."""
    attempts: dict[str, int] = field(default_factory=dict)
    """episode_id -> the highest attempt number recorded."""
    unfinished: dict[str, int] = field(default_factory=dict)
    """episode_id -> attempt started with neither a failure nor a result after it."""
    failures: dict[str, int] = field(default_factory=dict)
    """episode_id -> attempts of its current pass that failed on infrastructure (interrupted
    attempts and outage casualties not counted)."""
    superseded: int = 0
    """Results that a later pass replaced."""

    def observe(self, record: Mapping[str, Any]) -> None:
        """Fold one record into the state."""
        episode = str(record["episode_id"])
        kind = record["kind"]
        if "attempt" in record:
            self.attempts[episode] = max(self.attempts.get(episode, 0), int(record["attempt"]))
        if kind == ATTEMPT:
            self.unfinished[episode] = int(record["attempt"])
        elif kind == ATTEMPT_FAILED:
            self.unfinished.pop(episode, None)
            if not record.get("interrupted") and not record.get("outage"):
                self.failures[episode] = self.failures.get(episode, 0) + 1
        elif kind == RESULT:
            self.unfinished.pop(episode, None)
            self.results[episode] = dict(record)
        elif kind == SUPERSEDED:
            self.results.pop(episode, None)
            self.failures.pop(episode, None)
            self.superseded += 1


class EpisodeLedger(Protocol):
    """What the episode runner writes to: a :class:`Ledger`, or a worker process's link to its parent's."""

    path: Path
    """The ledger file (its folder is the run directory)."""
    state: LedgerState
    """What the records so far say (a worker process's: about the episodes it was handed)."""

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record durably (raises :class:`LedgerWriteError` when it cannot be)."""


class Ledger:
    """An append-only, fsync-ed record of a run's episodes; safe to share between threads.

    Use :meth:`open`, which also reads back what an earlier (possibly killed)
    run of the same directory recorded.
    """

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self.state = LedgerState()
        self.torn_bytes = 0
        """Bytes of a torn last line that :meth:`open` cut off (0: none)."""
        self._fsync = fsync
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        self._broken: LedgerWriteError | None = None

    @classmethod
    def open(cls, run_dir: Path, *, fsync: bool = True) -> Ledger:
        """Open (or create) ``run_dir/ledger.jsonl``, cut a torn last line, and load its state.

        The ledger stays locked (``flock``) until :meth:`close`, or until this process ends, however
        it ends: a second runner of the same run, such as a resume started while the first still
        runs, is refused instead of playing the same episodes.

        Raises:
            LedgerCorruptError: a line before the last one is not a whole record.
            LedgerInUseError: another process holds the ledger.
        """
        run_dir.mkdir(parents=True, exist_ok=True)
        ledger = cls(run_dir / LEDGER_FILE, fsync=fsync)
        fd = os.open(ledger.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            _lock_exclusively(fd, ledger.path)  # before reading: what we read stays true while we write
            ledger.torn_bytes = _cut_torn_tail(ledger.path)
            for record in read_records(ledger.path):
                ledger.state.observe(record)
        except BaseException:
            os.close(fd)
            raise
        ledger._fd = fd
        ledger._size = os.fstat(fd).st_size
        return ledger

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record durably.

        Raises:
            LedgerWriteError: the record could not be written (the file was cut back to the last
                whole record, and every later append raises this too).
            ConfigError: a record that would break the ledger's invariant (a bug in the caller:
                a second standing ``result`` for an episode, or superseding no result).
        """
        line = (json.dumps(record, ensure_ascii=False, default=str, allow_nan=False) + "\n").encode()
        with self._lock:
            if self._broken is not None:
                raise self._broken
            if self._fd is None:
                raise ConfigError("the ledger is closed")
            self._check(record)
            self._write(self._fd, line)
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

    def _check(self, record: Mapping[str, Any]) -> None:
        episode = record["episode_id"]
        if record["kind"] == RESULT and episode in self.state.results:
            raise ConfigError(f"episode {episode} already has a result; refusing a second one")
        if record["kind"] == SUPERSEDED and episode not in self.state.results:
            raise ConfigError(f"episode {episode} has no standing result to supersede")

    def _write(self, fd: int, line: bytes) -> None:
        """Write all of ``line``, or cut the file back to where it started and raise."""
        written = 0
        try:
            while written < len(line):
                n = os.write(fd, line[written:])
                if n <= 0:
                    raise OSError(f"write() wrote {n} bytes")
                written += n
            if self._fsync:
                os.fsync(fd)
        except OSError as exc:
            self._broken = self._failed(fd, exc, written, len(line))
            raise self._broken from exc
        self._size += len(line)

    def _failed(self, fd: int, exc: OSError, written: int, size: int) -> LedgerWriteError:
        try:
            os.ftruncate(fd, self._size)
            kept = f"cut back to its last whole record ({self._size} bytes)"
        except OSError as cut:
            kept = f"could not be cut back ({cut}); the next run cuts the torn line"
        resume = f"resume=true output_dir={self.path.parent}"
        return LedgerWriteError(
            f"writing the ledger {self.path} failed: {exc.strerror or exc} ({written} of {size} bytes of a record "
            f"written); the ledger was {kept}. Free space on that filesystem (or fix it), then resume with {resume}"
        )


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """The whole records of a ledger file, in order (a torn last line is skipped).

    Raises:
        LedgerCorruptError: a line before the last one is not a whole record.
    """
    with path.open("rb") as file:
        offset = 0
        for number, raw in enumerate(file, start=1):
            if not raw.endswith(b"\n"):
                return
            try:
                record = json.loads(raw)
            except ValueError:
                raise LedgerCorruptError(
                    f"{path}: line {number} (byte {offset}) is not a whole record; snapgym writes never leave one "
                    "there, so the file was edited or damaged: move that line out of the file and resume"
                ) from None
            offset += len(raw)
            yield record


def read_results(run_dir: Path) -> list[dict[str, Any]]:
    """The standing terminal records of a run directory's ledger (one per finished episode)."""
    path = run_dir / LEDGER_FILE
    if not path.exists():
        return []
    state = LedgerState()
    for record in read_records(path):
        state.observe(record)
    return list(state.results.values())


def _cut_torn_tail(path: Path) -> int:
    """Cut a last line without its newline (a write cut short); returns how many bytes were cut."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    torn = len(data) - end
    if torn:
        with path.open("r+b") as file:
            file.truncate(end)
        log.warning(
            "ledger %s: cut off a torn last line of %d bytes (a record cut short when a runner died or the disk "
            "filled); its attempt is played again",
            path,
            torn,
        )
    return torn


def _lock_exclusively(fd: int, path: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise LedgerInUseError(
            f"another runner is writing {path} (a run still going, or a resume of it); wait for it to end "
            "or stop it, then resume"
        ) from None
