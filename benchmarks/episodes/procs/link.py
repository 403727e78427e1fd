"""A worker process's side of the run's ledger: its records go to the parent, which writes them.

The parent holds the ledger (its file, its lock, the state of every episode); a worker asks it for
episodes to play (``claim``) and sends it every record (``append``), waiting for the answer, so a
record the worker moved past is on disk, as with a ledger of its own. The requests of a worker's
threads take turns on one pipe. What the worker knows of the ledger is what the parent told it about
the episodes it was handed (attempts and failures so far) and the records it sent since.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks.episodes.attempt import EpisodeSpec
from benchmarks.episodes.recording.ledger import LedgerState, LedgerWriteError
from pool.errors import SnapgymError

READY, CLAIM, APPEND, FATAL, STOP = "ready", "claim", "append", "fatal", "stop"
"""The messages: a worker's requests (``ready``, ``claim``, ``append``), its report of what stopped it
(``fatal``), and the parent's order to stop (``stop``, with the reason; None: Ctrl-C)."""


class ParentLedger:
    """The ledger of a worker process (an ``EpisodeLedger``); safe to share between threads.

    Args:
        rpc: the worker's end of its request pipe to the parent.
        path: the ledger file the parent writes (its folder is the run directory).
    """

    def __init__(self, rpc: Connection, path: Path) -> None:
        self.path = path
        self.state = LedgerState()
        self._rpc = rpc
        self._lock = threading.Lock()

    def ready(self) -> None:
        """Say this worker can play, and wait until the parent says go (when all its workers can: the
        first episodes do not run on one process while the others still start).

        Raises:
            LedgerWriteError: the parent is gone.
        """
        with self._lock:
            self._ask((READY,))

    def claim(self) -> EpisodeSpec | None:
        """The next episode to play, handed to this worker alone (None: there are no more).

        Raises:
            LedgerWriteError: the parent is gone.
        """
        with self._lock:
            reply = self._ask((CLAIM,))
            if reply is None:
                return None
            spec, attempts, failures = reply
            for counts, value in ((self.state.attempts, attempts), (self.state.failures, failures)):
                counts.pop(spec.episode_id, None)
                if value:
                    counts[spec.episode_id] = value
            return spec  # type: ignore[no-any-return]

    def append(self, record: Mapping[str, Any]) -> None:
        """Have the parent write one record durably; returns when it is on disk.

        Raises:
            LedgerWriteError: the parent could not write it, or is gone.
            ConfigError: the parent refused it (a second result, or an episode not handed to this worker).
        """
        with self._lock:
            reply = self._ask((APPEND, dict(record)))
            if isinstance(reply, BaseException):
                raise reply
            self.state.observe(record)

    def report(self, error: BaseException) -> None:
        """Tell the parent what stopped this worker (it stops the run's other workers). Never raises."""
        with self._lock:
            try:
                self._rpc.send((FATAL, error))
            except Exception:  # an error that does not pickle goes as its type and message
                with contextlib.suppress(OSError):
                    self._rpc.send((FATAL, SnapgymError(f"{type(error).__name__}: {error}")))

    def _ask(self, message: tuple[Any, ...]) -> Any:
        try:
            self._rpc.send(message)
            return self._rpc.recv()
        except (EOFError, OSError) as exc:
            raise LedgerWriteError(
                f"the runner's parent process, which writes the ledger {self.path}, is gone ({exc or 'closed'}); "
                f"resume the run with resume=true output_dir={self.path.parent}"
            ) from None
