"""The progress bar of a run (tqdm on stderr): episodes done, mean reward so far, infra retries."""

from __future__ import annotations

import threading
import time
from typing import Any

from tqdm import tqdm

from benchmarks.episodes.attempt import INFRA_ERROR

_REFRESH_S = 0.5
"""How often the bar is redrawn (and its mean reward recomputed)."""


class Progress:
    """Counts results as the runner records them; thread-safe.

    It is called once per episode on the runner's hot path, so it keeps a running sum and formats
    the bar's figures only when the bar is redrawn (every ``_REFRESH_S``, and at the end).
    """

    def __init__(self, *, total: int, done: int, enabled: bool, description: str) -> None:
        self._bar = tqdm(total=total, initial=done, disable=not enabled, desc=description, unit="ep",
                         mininterval=_REFRESH_S, dynamic_ncols=True)  # fmt: skip
        self._lock = threading.Lock()
        self._reward_sum = 0.0
        self._scored = 0
        self._infra = 0
        self._shown_at = 0.0

    @property
    def mean_reward(self) -> float:
        """The mean reward of the results counted so far (infra errors left out); 0.0 before any."""
        return self._reward_sum / self._scored if self._scored else 0.0

    def update(self, record: dict[str, Any]) -> None:
        """Count one result record."""
        with self._lock:
            if record["outcome"] == INFRA_ERROR:
                self._infra += 1
            else:
                self._reward_sum += float(record["reward"] or 0.0)
                self._scored += 1
            if self._bar.disable:
                return
            now = time.monotonic()
            if now - self._shown_at >= _REFRESH_S:
                self._shown_at = now
                self._show_figures()
            self._bar.update(1)

    def _show_figures(self) -> None:
        self._bar.set_postfix(reward=f"{self.mean_reward:.3f}", infra=self._infra, refresh=False)

    def close(self) -> None:
        """Finish the bar (with the final figures)."""
        with self._lock:
            if not self._bar.disable:
                self._show_figures()
        self._bar.close()
