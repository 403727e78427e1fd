"""A creation rate limit shared by every process of a run: on a machine, and across a Ray cluster.

Cloud providers refuse bursts (E2B and Modal answer 429 / RESOURCE_EXHAUSTED);
a run that creates sandboxes from many processes (a Ray node's workers, a
pool's host actor and the runner) must pace them together, not each alone.
:class:`CreationLimiter` is a token bucket whose state lives in a small file
under a lock (``fcntl``), so every process that opens the same file shares one
budget: ``rate`` creations per second on average, bursts of up to ``burst``.
Without a file it paces the threads of one process. In a process of a Ray cluster,
:func:`shared_limiter` keeps the bucket in one named actor instead, so the
hosts of a pool on every node share one budget (falling back to the machine's
file when the actor cannot be reached).

    limiter = CreationLimiter(rate=5, burst=10, path=run_dir / "e2b-creates.bucket")
    limiter.acquire()   # blocks until a creation may start
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from pool.errors import ConfigError


class CreationLimiter:
    """A token bucket: at most ``burst`` at once, refilled at ``rate`` per second."""

    def __init__(self, rate: float, burst: int = 1, path: str | Path | None = None) -> None:
        if rate <= 0 or burst < 1:
            raise ConfigError(f"a creation limit needs rate > 0 and burst >= 1, got rate={rate}, burst={burst}")
        self.rate = float(rate)
        self.burst = int(burst)
        self.path = None if path is None else Path(path)
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._stamp = time.time()

    def acquire(self, timeout_s: float | None = None) -> float:
        """Take one token, waiting as long as needed (or ``timeout_s``); the seconds waited.

        Raises:
            TimeoutError: no token within ``timeout_s``.
        """
        started = time.monotonic()
        while True:
            wait = self._take()
            if wait <= 0:
                return time.monotonic() - started
            if timeout_s is not None and time.monotonic() - started + wait > timeout_s:
                raise TimeoutError(f"no creation slot within {timeout_s:g}s (limit {self.rate:g}/s)")
            time.sleep(wait)

    def _take(self) -> float:
        """Take a token if one is there (0.0), else how long until one is."""
        with self._lock:
            if self.path is None:
                self._tokens, self._stamp, wait = self._refill_and_take(self._tokens, self._stamp)
                return wait
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                tokens, stamp = self._read(fd)
                tokens, stamp, wait = self._refill_and_take(tokens, stamp)
                os.lseek(fd, 0, os.SEEK_SET)
                os.ftruncate(fd, 0)
                os.write(fd, json.dumps({"tokens": tokens, "stamp": stamp}).encode())
                return wait
            finally:
                os.close(fd)

    def _refill_and_take(self, tokens: float, stamp: float) -> tuple[float, float, float]:
        now = time.time()
        tokens = min(float(self.burst), tokens + max(now - stamp, 0.0) * self.rate)
        if tokens >= 1.0:
            return tokens - 1.0, now, 0.0
        return tokens, now, (1.0 - tokens) / self.rate

    def _read(self, fd: int) -> tuple[float, float]:
        raw = os.read(fd, 4096)
        try:
            state = json.loads(raw) if raw else {}
            return float(state["tokens"]), float(state["stamp"])
        except (ValueError, KeyError, TypeError):
            return float(self.burst), time.time()  # new or unreadable: a full bucket

    def take(self) -> float:
        """One attempt: 0.0 when a token was taken, else how long until one is (for :class:`RayLimiter`)."""
        return self._take()


class RayLimiter:
    """The same bucket in a named Ray actor, shared by every process of the cluster."""

    def __init__(self, handle: Any, fallback: CreationLimiter) -> None:
        self._handle = handle
        self._fallback = fallback

    def acquire(self, timeout_s: float | None = None) -> float:
        """Take a token from the cluster's bucket (the machine's, if the actor is gone); the seconds waited."""
        import ray

        started = time.monotonic()
        while True:
            try:
                wait = float(ray.get(self._handle.take.remote(), timeout=30))
            except Exception:
                return self._fallback.acquire(timeout_s)
            if wait <= 0:
                return time.monotonic() - started
            if timeout_s is not None and time.monotonic() - started + wait > timeout_s:
                raise TimeoutError(f"no creation slot within {timeout_s:g}s")
            time.sleep(wait)


Limiter = CreationLimiter | RayLimiter


def shared_limiter(rate: float, burst: int, path: Path, *, key: str) -> Limiter:
    """The pace for an account: a Ray actor named after ``key`` when this process is part of a Ray
    cluster (the first process to ask makes it), else the bucket file at ``path``."""
    local = CreationLimiter(rate, burst, path)
    try:
        import ray

        if not ray.is_initialized():
            return local
        remote: Any = ray.remote  # Ray's stubs do not cover actor options
        actor = remote(num_cpus=0, max_concurrency=64)(CreationLimiter)
        handle = actor.options(name=f"snapgym-ratelimit-{key}", namespace="snapgym", get_if_exists=True).remote(
            rate, burst
        )
        return RayLimiter(handle, local)
    except Exception:  # no Ray, or the actor cannot be made: the machine's file
        return local
