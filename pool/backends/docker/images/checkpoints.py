"""The checkpoint images one backend took or adopted: what it removes when it closes.

A checkpoint of a run (a sandbox labelled ``snapgym.run``) can be kept for that run's resume
(``keep_runs``); a resume that starts a sandbox at a checkpoint it did not take adopts every
checkpoint of the run whose maker is gone, so that they are removed once, by it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from pool.backends.docker.transport import reaper
from pool.labels import RUN
from pool.snapshots import Snapshot


class Checkpoints:
    """The checkpoint images of one backend, each with the run it serves (or None)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._images: dict[str, str | None] = {}
        self._adopted_runs: set[str] = set()

    def add(self, image_id: str, run: str | None) -> None:
        """A checkpoint this backend took."""
        with self._lock:
            self._images[image_id] = run

    def keep_runs(self) -> int:
        """Leave the checkpoints of runs out of :meth:`remove`; how many."""
        with self._lock:
            kept = [image for image, run in self._images.items() if run]
            for image in kept:
                del self._images[image]
        return len(kept)

    def adopt(self, api: Any, snapshot: Snapshot, labels: Mapping[str, str]) -> None:
        """Before a sandbox of run ``labels[RUN]`` starts at checkpoint ``snapshot`` that this backend did not
        take (a resume after the runner was killed): take over every checkpoint of that run whose maker is
        gone."""
        run = labels.get(RUN)
        if snapshot.parent is None or not run:
            return
        with self._lock:
            if snapshot.digest in self._images or run in self._adopted_runs:
                return
            self._adopted_runs.add(run)
        found = reaper.dead_checkpoints_of_run(api, run)
        with self._lock:
            self._images.update(dict.fromkeys(found, run))

    def remove(self, api: Any) -> None:
        """Remove every checkpoint held (one a container still runs from stays)."""
        with self._lock:
            images = dict(self._images)
        reaper.remove_images(api, images)
