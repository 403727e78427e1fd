"""One sandbox's door to the egress proxy: its listening socket, its policy, its audit records.

Everything here but :meth:`Gate.drain` runs on the proxy's event loop; the
public methods hand their work to it and wait, so they can be called from any
thread. The records sit behind a lock of their own so that draining never
waits for the loop.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import itertools
import socket
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pool.egress.connection.attempt import Attempt
from pool.egress.connection.relay import deliver, flush, lost_on_close, reply, reset, shut, unsent
from pool.egress.connection.route import Network
from pool.egress.connection.session import serve
from pool.egress.limits import ProxyLimits
from pool.egress.loop import LoopThread
from pool.egress.settings import EgressSettings
from pool.errors import BackendError
from pool.network.audit import DENIED, Connection
from pool.network.policy import NetworkPolicy, Phase

if TYPE_CHECKING:
    from pool.egress.cache.downloads import DownloadCache

_ACCEPT_BURST = 32
_Work = Callable[[asyncio.StreamReader, asyncio.StreamWriter, Attempt], Coroutine[Any, Any, None]]


@dataclass(slots=True)
class _Client:
    """One accepted connection (mutable: its writer appears once its streams are made)."""

    sock: socket.socket
    attempt: Attempt
    sequence: int
    writer: asyncio.StreamWriter | None = None
    recorded: bool = field(default=False)


class Gate:
    """The proxy's side of one sandbox: connections accepted on its socket follow its policy.

    Made by :meth:`EgressProxy.open_gate`; every method may be called from any thread.
    """

    def __init__(
        self,
        loop: LoopThread,
        listener: socket.socket,
        policy: NetworkPolicy,
        phase: Phase,
        settings: EgressSettings,
        limits: ProxyLimits,
        *,
        cache: DownloadCache | None = None,
    ) -> None:
        self._loop = loop
        self._listener = listener
        self._policy, self._phase = policy, phase
        self._limits = limits
        self._network = Network(settings, limits, asyncio.Semaphore(limits.max_lookups), cache)
        self._clients: dict[asyncio.Task[None], _Client] = {}
        self._sequence = itertools.count()
        self._accepting = False
        self._retry: asyncio.TimerHandle | None = None
        self._closed = False
        self._cut_reason = "cut"
        self._records: list[tuple[int, Connection]] = []
        self._dropped = 0
        self._records_lock = threading.Lock()

    @property
    def policy(self) -> NetworkPolicy:
        """The policy new connections follow."""
        return self._policy

    @property
    def phase(self) -> Phase:
        """The phase new connections are recorded under."""
        return self._phase

    @property
    def open_connections(self) -> int:
        """How many connections the gate is serving now."""
        return len(self._clients)

    @property
    def is_closed(self) -> bool:
        """Whether the gate stopped listening."""
        return self._closed

    def set_policy(self, policy: NetworkPolicy, phase: Phase) -> None:
        """Make new connections follow ``policy`` and be recorded under ``phase``.

        The connections still open are cut first, and their records written, before this
        returns: nothing allowed under the previous phase outlives it.

        Raises:
            BackendError: the gate is closed.
        """
        self._loop.call(self._set_policy(policy, phase))

    def drain(self) -> tuple[list[Connection], int]:
        """The records of the attempts that ended since the last drain, in the order they
        began, and how many more ended but were dropped over the cap."""
        with self._records_lock:
            records, dropped = self._records, self._dropped
            self._records, self._dropped = [], 0
        return [record for _, record in sorted(records, key=lambda item: item[0])], dropped

    def close(self) -> None:
        """Stop listening and cut every open connection (their records are written before
        this returns). Closing again does nothing."""
        if self._closed:
            return
        try:  # one plain callback on the loop; a task only when there are connections to cut
            if self._loop.run(self._stop_accepting):
                self._loop.call(self._cut("cut: the gate closed"))
        except BackendError:
            if not self._closed:
                raise

    def start(self) -> None:
        """Begin accepting (on the loop: a plain callback, see :meth:`LoopThread.submit`)."""
        self._listener.setblocking(False)
        self._watch()

    async def shutdown(self, reason: str) -> None:
        """Stop accepting, close the socket, cut the open connections (on the loop)."""
        if self._stop_accepting():
            await self._cut(reason)

    def _stop_accepting(self) -> bool:
        """Stop accepting and close the socket (on the loop); whether connections are open to cut."""
        if self._closed:
            return False
        self._closed = True
        self._unwatch()
        if self._retry is not None:
            self._retry.cancel()
        self._listener.close()
        return bool(self._clients)

    async def _set_policy(self, policy: NetworkPolicy, phase: Phase) -> None:
        if self._closed:
            raise BackendError("the egress gate is closed")
        self._policy, self._phase = policy, phase
        await self._cut("cut: the policy changed")

    async def _cut(self, reason: str) -> None:
        tasks = list(self._clients)
        if not tasks:
            return
        self._cut_reason = reason
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)

    # Accepting is a reader callback on the listener, not a task: a gate opened and closed with no
    # connection (most episodes' no-network gates) then costs the loop two short callbacks.

    def _watch(self) -> None:
        if not self._closed and not self._accepting:
            asyncio.get_running_loop().add_reader(self._listener.fileno(), self._accept_ready)
            self._accepting = True

    def _unwatch(self) -> None:
        if self._accepting:
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._accepting = False

    def _accept_ready(self) -> None:
        for _ in range(_ACCEPT_BURST):  # then the loop serves the others before taking more
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    continue
                # Out of descriptors or memory: wait for connections to end instead of spinning.
                self._unwatch()
                self._retry = asyncio.get_running_loop().call_later(0.1, self._watch)
                return
            sock.setblocking(False)
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        client = _Client(sock, Attempt(phase=self._phase.value), next(self._sequence))
        work: _Work = self._turn_away
        if len(self._clients) < self._limits.max_connections:
            work = functools.partial(self._request, self._policy)  # the policy of the moment it arrived
        task = asyncio.create_task(self._serve(client, work))
        self._clients[task] = client
        task.add_done_callback(self._finished)

    async def _request(
        self, policy: NetworkPolicy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, attempt: Attempt
    ) -> None:
        await serve(reader, writer, attempt, policy, self._network)

    async def _turn_away(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, attempt: Attempt) -> None:
        attempt.decided(DENIED, "too many connections")
        body = f"snapgym egress: too many connections (at most {self._limits.max_connections} open)"
        await reply(writer, 503, body, self._limits.reply_timeout_s)

    async def _serve(self, client: _Client, work: _Work) -> None:
        attempt = client.attempt
        reader: asyncio.StreamReader | None = None
        try:
            reader, client.writer = await asyncio.open_connection(sock=client.sock, limit=self._limits.max_head_bytes)
            await work(reader, client.writer, attempt)
        except OSError as exc:
            attempt.error = attempt.error or f"connection lost ({(exc.strerror or type(exc).__name__).lower()})"
        except Exception as exc:  # a bug must cost one connection, never the gate
            attempt.error = f"proxy error: {type(exc).__name__}"
        if client.writer is not None:
            if attempt.is_broken:  # what was sent reaches the client, the rest is not counted
                await deliver(client.writer, self._limits.reply_timeout_s)
                attempt.lost(unsent(client.writer))
            else:
                if attempt.error is None:  # a transfer that ended: its last bytes reach the client first
                    await flush(client.writer, self._limits.idle_timeout_s)
                attempt.lost(lost_on_close(client.writer))
        # Recorded before the client sees the connection end: once it saw the end, a drain has the record.
        self._record(client)
        if reader is not None and client.writer is not None:
            if attempt.is_broken:  # a reset: no client takes the end of a broken transfer for its end
                reset(client.writer)
            else:
                await shut(reader, client.writer, self._limits.reply_timeout_s)

    def _finished(self, task: asyncio.Task[None]) -> None:
        client = self._clients.pop(task)
        if not client.recorded:  # cut (or failed) before it finished
            attempt = client.attempt
            if task.cancelled():
                attempt.error = attempt.error or self._cut_reason
            elif task.exception() is not None:
                attempt.error = attempt.error or f"proxy error: {type(task.exception()).__name__}"
            self._record(client)
        if client.writer is not None:
            reset(client.writer)  # a no-op once closed; else the connection was cut
        else:
            client.sock.close()

    def _record(self, client: _Client) -> None:
        if client.recorded:
            return
        client.recorded = True
        record = client.attempt.record()
        with self._records_lock:
            if len(self._records) >= self._limits.max_records:
                self._dropped += 1
            else:
                self._records.append((client.sequence, record))
