"""Model requests that a stopping run can cut, and a record of whether the endpoint ever answered.

A run that stops (Ctrl-C, an outage's breaker, an endpoint that never answered) must not wait for a
model request that may never end: ``urllib`` waits out the request's whole timeout (two minutes by
default) for a reply that a hung server never sends. :class:`Calls` opens each request through
connections whose sockets it keeps, so :meth:`Calls.cut` can shut them down: the waiting read ends at
once, the request fails as the endpoint being unavailable, and no retry follows. Until
:meth:`Calls.allow`, new requests fail at once too.

It also remembers whether any request of the run got a reply (:attr:`Calls.answered`): the runner's
first-contact watch (``benchmarks.episodes.outage``) stops a run whose endpoint has not answered once.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import socket
import threading
import urllib.request
import weakref
from typing import Any


class CallCutError(ConnectionError):
    """The run is stopping: the request was cut, or not sent."""


class Calls:
    """The model requests of one agent: open through it, cut them all, and see whether one was answered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._cut = threading.Event()
        self._answered = False

    @property
    def is_cut(self) -> bool:
        """True between :meth:`cut` and :meth:`allow`."""
        return self._cut.is_set()

    @property
    def answered(self) -> bool:
        """True once the endpoint replied to a request of this agent (or to its health probe)."""
        return self._answered

    def note_answer(self) -> None:
        """The endpoint replied."""
        self._answered = True

    def open(self, request: urllib.request.Request, timeout: float) -> Any:
        """``urllib.request.urlopen(request, timeout=timeout)``, through connections :meth:`cut` can shut.

        Raises:
            CallCutError: the calls are cut.
        """
        if self._cut.is_set():
            raise CallCutError("the run is stopping: no new model request")
        opener = urllib.request.build_opener(_HttpHandler(self), _HttpsHandler(self))
        return opener.open(request, timeout=timeout)

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a retry's backoff), or less when the calls are cut.

        Raises:
            CallCutError: the calls were cut before or during the wait.
        """
        if self._cut.wait(seconds):
            raise CallCutError("the run is stopping: no retry")

    def cut(self) -> None:
        """Make every request in flight fail now, and every new one fail at once, until :meth:`allow`."""
        with self._lock:
            self._cut.set()
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def allow(self) -> None:
        """Let requests through again (a new run begins)."""
        self._cut.clear()

    def track(self, sock: socket.socket) -> None:
        """Keep a newly connected socket, so that :meth:`cut` can shut it (shut at once if the calls are cut)."""
        with self._lock:
            cut = self._cut.is_set()
            if not cut:
                self._sockets.add(sock)
        if cut:
            _shut(sock)
            raise CallCutError("the run is stopping: no new model request")


def _shut(sock: socket.socket) -> None:
    """End every read and write of ``sock`` now (a socket already closed is left alone)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _TrackedHTTPConnection(http.client.HTTPConnection):
    """A connection whose socket :class:`Calls` keeps once connected (so that a cut can shut it)."""

    def __init__(self, *args: Any, calls: Calls, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._calls = calls

    def connect(self) -> None:
        super().connect()
        self._calls.track(self.sock)


class _TrackedHTTPSConnection(_TrackedHTTPConnection, http.client.HTTPSConnection):
    """The same over TLS: ``HTTPSConnection.connect`` wraps the socket first, and the wrapped one is kept."""


class _HttpHandler(urllib.request.HTTPHandler):
    def __init__(self, calls: Calls) -> None:
        super().__init__()
        self._calls = calls

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_TrackedHTTPConnection, calls=self._calls), req)


class _HttpsHandler(urllib.request.HTTPSHandler):
    def __init__(self, calls: Calls) -> None:
        super().__init__()
        self._calls = calls

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = functools.partial(_TrackedHTTPSConnection, calls=self._calls)
        return self.do_open(connection, req, context=self._context)  # type: ignore[attr-defined]
