"""The ledger records one runner session writes (their kinds and meaning are in ``recording.ledger``).

Every record names the session (``run_id``) and carries ``at``, the wall-clock
time, for people reading the ledger. Durations never come from it: a result
also carries ``session_started_s`` and ``session_finished_s``, seconds since
the session began on the monotonic clock, which the summary's throughput uses
(they compare only within one ``run_id``).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict
from dataclasses import fields as dataclass_fields
from typing import Any

from benchmarks.episodes.attempt import AttemptResult, EpisodeSpec
from benchmarks.episodes.recording.episodefiles import changes_record, network_record
from benchmarks.episodes.recording.ledger import ATTEMPT, ATTEMPT_FAILED, RESULT, SUPERSEDED, attempt_id

Started = tuple[float, float]
"""When an attempt started: (wall-clock time, seconds on the session's monotonic clock)."""


class SessionRecords:
    """Makes the records of one session of the runner.

    Args:
        agent: the agent's name.
        env_id: the environment every episode runs in.
        success_threshold: a reward at or above this is a pass.
    """

    def __init__(self, *, agent: str, env_id: str, success_threshold: float) -> None:
        self.run_id = uuid.uuid4().hex[:12]
        self._agent = agent
        self._env_id = env_id
        self._threshold = success_threshold
        self._began = time.monotonic()

    @property
    def began(self) -> float:
        """When the session began, on the monotonic clock (system-wide on Linux)."""
        return self._began

    def join(self, run_id: str, began: float) -> None:
        """Make the records of another process's session: its ``run_id`` and its clock (``began``), so a
        worker process's results count as the session's (throughput spans one ``run_id``'s clock)."""
        self.run_id, self._began = run_id, began

    def now(self) -> Started:
        """This moment, on both clocks."""
        return time.time(), time.monotonic() - self._began

    def attempt(self, episode_id: str, attempt: int) -> dict[str, Any]:
        """An attempt starts."""
        return self._record(ATTEMPT, episode_id, attempt)

    def failed(
        self, episode_id: str, attempt: int, error: str | None, *, interrupted: bool = False, outage: str | None = None
    ) -> dict[str, Any]:
        """An attempt failed on infrastructure (or was cut short, or fell in an outage) and runs again."""
        record = {**self._record(ATTEMPT_FAILED, episode_id, attempt), "interrupted": interrupted}
        if outage is not None:
            record.update(outage=True, outage_reason=outage)
        return {**record, "error": error}

    def superseded(self, episode_id: str, attempt: int, reason: str) -> dict[str, Any]:
        """The episode's standing result (ended by ``attempt``) no longer stands."""
        return {**self._record(SUPERSEDED, episode_id, attempt), "reason": reason}

    def result(
        self,
        spec: EpisodeSpec,
        attempt: int,
        result: AttemptResult,
        *,
        started: Started,
        failures: int,
        snapshot: Any,
        backend: str,
        files: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """The episode's terminal record, with its provenance and timings (``files``: the episode's
        files by kind, relative to the run directory)."""
        # the episode's files hold the trajectory and the verifier's output; the rest is flat data
        # (a shallow copy: asdict() would deep-copy the whole trajectory only to drop it)
        fields = {f.name: getattr(result, f.name) for f in dataclass_fields(result)
                  if f.name not in ("trajectory", "verifier")}  # fmt: skip
        extra = dict(fields.pop("extra"))
        fields["network"] = network_record(fields.pop("network"))
        fields["changes"] = changes_record(fields.pop("changes"))
        finished = self.now()
        return {
            "kind": RESULT,
            "run_id": self.run_id,
            **asdict(spec),
            "attempt": attempt,
            "attempt_id": attempt_id(spec.episode_id, attempt),
            "infra_failures": failures,
            **fields,
            "sandbox_s": result.episode_s,  # what a provider bills: the episode held a sandbox from reset to verdict
            "passed": result.reward is not None and result.reward >= self._threshold,
            "task_snapshot_id": getattr(snapshot, "id", None),
            "task_snapshot_digest": getattr(snapshot, "digest", None),
            "backend": backend,
            "agent": self._agent,
            "env_id": self._env_id,
            "started_at": started[0],
            "finished_at": finished[0],
            "session_started_s": started[1],
            "session_finished_s": finished[1],
            **({"files": files} if files else {}),
            **extra,
        }

    def _record(self, kind: str, episode_id: str, attempt: int) -> dict[str, Any]:
        return {
            "kind": kind,
            "run_id": self.run_id,
            "episode_id": episode_id,
            "attempt": attempt,
            "attempt_id": attempt_id(episode_id, attempt),
            "at": time.time(),
        }
