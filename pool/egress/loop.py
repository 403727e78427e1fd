"""The egress proxy's event loop, on a daemon thread of its own, and calls into it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from pool.errors import BackendError

T = TypeVar("T")

CALL_TIMEOUT_S = 60.0
"""The longest a caller waits for the loop (cutting a gate's connections takes milliseconds)."""
RESOLVER_THREADS = 32
"""Threads for name lookups (``getaddrinfo`` blocks); each gate may hold only a few of them."""


class LoopThread:
    """An asyncio loop running on a daemon thread until :meth:`stop`."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._resolver = ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="snapgym-egress-dns")
        self._loop.set_default_executor(self._resolver)
        self._thread = threading.Thread(target=self._loop.run_forever, name="snapgym-egress", daemon=True)
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        """Run ``coroutine`` on the loop and wait for its result (its exception is raised here).

        Raises:
            BackendError: the loop is stopped, or did not finish the call in ``timeout_s``.
        """
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a blocking egress proxy call from the proxy's own thread would deadlock")
        if self._loop.is_closed() or not self._thread.is_alive():
            coroutine.close()
            raise BackendError("the egress proxy's event loop is stopped")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise BackendError(f"the egress proxy's event loop did not answer in {timeout_s:g} s") from None

    def run(self, function: Callable[[], T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        """Run the plain ``function`` on the loop and wait for its result (its exception is raised here).

        Cheaper than :meth:`call`: one callback on the loop, no task. For work that does not wait.

        Raises:
            BackendError: the loop is stopped, or did not run ``function`` in ``timeout_s``.
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking egress proxy call from the proxy's own thread would deadlock")
        done: Future[T] = Future()

        def on_loop() -> None:
            try:
                done.set_result(function())
            except BaseException as exc:  # handed to the caller
                done.set_exception(exc)

        self.submit(on_loop)
        try:
            return done.result(timeout_s)
        except TimeoutError:
            raise BackendError(f"the egress proxy's event loop did not answer in {timeout_s:g} s") from None

    def submit(self, function: Callable[[], None]) -> None:
        """Run the plain ``function`` on the loop without waiting (calls run in the order they came).

        Raises:
            BackendError: the loop is stopped.
        """
        if self._loop.is_closed() or not self._thread.is_alive():
            raise BackendError("the egress proxy's event loop is stopped")
        try:
            self._loop.call_soon_threadsafe(function)
        except RuntimeError:  # closed between the check and the call
            raise BackendError("the egress proxy's event loop is stopped") from None

    def post(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Start ``coroutine`` on the loop without waiting for it (calls run in the order they came).

        Raises:
            BackendError: the loop is stopped.
        """
        if self._loop.is_closed() or not self._thread.is_alive():
            coroutine.close()
            raise BackendError("the egress proxy's event loop is stopped")
        asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def stop(self) -> None:
        """Stop the loop and its thread; what still runs on it is abandoned."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()
        # Lookups stuck in the system resolver end on their own; nobody waits for them.
        self._resolver.shutdown(wait=False, cancel_futures=True)
