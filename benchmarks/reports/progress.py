"""The progress bar of a run (tqdm on stderr): episodes done, mean reward so far, infra retries."""

from __future__ import annotations

import threading
from typing import Any

from tqdm import tqdm

from benchmarks.episodes.attempt import INFRA_ERROR


class Progress:
    """Counts results as the runner records them; thread-safe."""

    def __init__(self, *, total: int, done: int, enabled: bool, description: str) -> None:
        self._bar = tqdm(total=total, initial=done, disable=not enabled, desc=description, unit="ep",
                         mininterval=0.5, dynamic_ncols=True)  # fmt: skip
        self._lock = threading.Lock()
        self._rewards: list[float] = []
        self._infra = 0

    def update(self, record: dict[str, Any]) -> None:
        """Count one result record."""
        with self._lock:
            if record["outcome"] == INFRA_ERROR:
                self._infra += 1
            else:
                self._rewards.append(float(record["reward"] or 0.0))
            mean = sum(self._rewards) / len(self._rewards) if self._rewards else 0.0
            self._bar.set_postfix(reward=f"{mean:.3f}", infra=self._infra, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        """Finish the bar."""
        self._bar.close()
