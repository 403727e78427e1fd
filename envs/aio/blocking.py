"""The small fixed set of threads that the asynchronous API runs blocking work on.

What blocks, and so runs here rather than on the event loop: ``reset()`` (the backend restores or
creates a sandbox, a pool leases one), the verifier at an episode's end, ``close()``, checkpoints,
and any step whose backend has no asynchronous path (Docker, the cloud backends, a pooled lease,
Python-v0). The threads are shared by every episode of the loop, so their number does not grow with
the episodes in flight; a step in the local backend's shell session needs none of them.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pool.errors import ConfigError

T = TypeVar("T")

DEFAULT_THREADS = 16
"""Threads of the shared executor: enough to keep resets and verifiers of a machine's pool busy."""


class Blocking:
    """A fixed executor for the blocking parts of episodes.

    Args:
        threads: how many at most (fixed: not one per episode).
    """

    def __init__(self, threads: int = DEFAULT_THREADS) -> None:
        if threads < 1:
            raise ConfigError(f"Blocking needs threads >= 1, got {threads}")
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="snapgym-aio")

    async def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``function(*args, **kwargs)`` on one of the threads; the caller's task waits, the loop does not."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(function, *args, **kwargs))

    def close(self) -> None:
        """Stop the threads once their work is done."""
        self._pool.shutdown(wait=True)


_shared: Blocking | None = None
_shared_lock = threading.Lock()


def shared() -> Blocking:
    """The process's shared executor (:data:`DEFAULT_THREADS` threads, made on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Blocking()
        return _shared
