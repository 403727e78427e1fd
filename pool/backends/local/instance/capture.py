"""Collect a command's output from its pipes: capped, and never stalling.

Past the cap, output is read and thrown away, so a flood neither fills host
memory nor blocks the writer. Output written by background processes after the
command itself exits is not waited for.
"""

from __future__ import annotations

import asyncio
import os
import select
import time
from dataclasses import dataclass

from pool.backends.local.daemon.client import STATUS_SIZE, decode_session_status, decode_status
from pool.results import CappedBuffer

_READ_SIZE = 1 << 16
_DRAIN_S = 0.05


@dataclass(slots=True)
class Captured:
    """What came back from one exec."""

    stdout: CappedBuffer
    stderr: CappedBuffer
    status: tuple[int, bool, int] | None
    host_deadline_hit: bool = False


def collect(out_fd: int, err_fd: int, status_fd: int, *, cap: int, deadline_s: float | None) -> Captured:
    """Read both streams and the status record until the status arrives.

    Args:
        out_fd: read end of stdout; closed on return.
        err_fd: read end of stderr; closed on return.
        status_fd: read end of the status pipe; closed on return.
        cap: bytes kept per stream.
        deadline_s: a host-side backstop (monotonic clock) in case the sandbox
            stops answering; the sandbox enforces the real timeout itself.
    """
    for fd in (out_fd, err_fd, status_fd):
        os.set_blocking(fd, False)
    try:
        got = _until_status(out_fd, err_fd, status_fd, cap=cap, deadline_s=deadline_s)
    finally:
        for fd in (out_fd, err_fd, status_fd):
            os.close(fd)
    status = decode_status(got.record) if got.record else None
    return Captured(got.stdout, got.stderr, status, got.host_deadline_hit)


@dataclass(slots=True)
class StepCaptured:
    """What came back from one step of a shell session (see sandboxd/instance/session.c)."""

    stdout: CappedBuffer
    stderr: CappedBuffer
    status: tuple[int, bool, int, bool] | None
    """(code, timed_out, errno, session_goes_on); None: the status stream ended or the deadline passed."""
    host_deadline_hit: bool = False
    streams_open: bool = True
    """False when stdout or stderr reached end of file (the session cannot take another step)."""


def collect_step(out_fd: int, err_fd: int, status_fd: int, *, cap: int, deadline_s: float | None) -> StepCaptured:
    """Read a session's streams until the step's status record arrives; the descriptors stay open
    for the next step (all three must be non-blocking)."""
    got = _until_status(out_fd, err_fd, status_fd, cap=cap, deadline_s=deadline_s)
    status = decode_session_status(got.record) if got.record else None
    return StepCaptured(got.stdout, got.stderr, status, got.host_deadline_hit, got.streams_open)


async def collect_step_async(
    out_fd: int, err_fd: int, status_fd: int, *, cap: int, deadline_s: float | None
) -> StepCaptured:
    """:func:`collect_step` on the running event loop: the pipes are watched by the loop's selector,
    so waiting for a step holds no thread."""
    got = await _until_status_async(out_fd, err_fd, status_fd, cap=cap, deadline_s=deadline_s)
    status = decode_session_status(got.record) if got.record else None
    return StepCaptured(got.stdout, got.stderr, status, got.host_deadline_hit, got.streams_open)


@dataclass(slots=True)
class _Read:
    stdout: CappedBuffer
    stderr: CappedBuffer
    record: bytes | None
    host_deadline_hit: bool
    streams_open: bool


class _Reading:
    """The state of one read of stdout, stderr and a status record, shared by the poll() loop and
    the event loop's: a chunk at a time from whichever pipe is ready, until one whole status record
    came or the status stream ended. Exactly one record is taken from the status stream: a
    session's next one (its end) stays there."""

    def __init__(self, out_fd: int, err_fd: int, status_fd: int, cap: int) -> None:
        self.fds = (out_fd, err_fd, status_fd)
        self.open_fds = set(self.fds)
        self._bufs = {out_fd: CappedBuffer(cap), err_fd: CappedBuffer(cap)}
        self._status = b""

    @property
    def complete(self) -> bool:
        """A whole record came, or the status stream ended without one."""
        return len(self._status) == STATUS_SIZE or self.fds[2] not in self.open_fds

    def take(self, fd: int) -> bool | None:
        """One chunk from ``fd``: None when nothing was there, False at its end (it is no longer open),
        True otherwise."""
        status = fd == self.fds[2]
        chunk = _read(fd, STATUS_SIZE - len(self._status) if status else _READ_SIZE)
        if chunk is None:
            return None
        if not chunk:
            self.open_fds.discard(fd)
            return False
        if status:
            self._status += chunk
        else:
            self._bufs[fd].add(chunk)
        return True

    def result(self, host_deadline_hit: bool) -> _Read:
        """What was read, with what the output pipes already hold (see :func:`_drain`)."""
        out_fd, err_fd, _ = self.fds
        _drain(self._bufs, self.open_fds)
        record = self._status if len(self._status) == STATUS_SIZE else None
        streams_open = out_fd in self.open_fds and err_fd in self.open_fds
        return _Read(self._bufs[out_fd], self._bufs[err_fd], record, host_deadline_hit, streams_open)


def _until_status(out_fd: int, err_fd: int, status_fd: int, *, cap: int, deadline_s: float | None) -> _Read:
    """Read stdout and stderr (capped) until one whole status record came, the status stream ended
    or the deadline passed; then what the pipes already hold (see :class:`_Reading`)."""
    reading = _Reading(out_fd, err_fd, status_fd, cap)
    poller = select.poll()
    for fd in reading.fds:
        poller.register(fd, select.POLLIN)
    while not reading.complete:
        timeout_ms = None
        if deadline_s is not None:
            left = deadline_s - time.monotonic()
            if left <= 0:
                return reading.result(host_deadline_hit=True)
            timeout_ms = int(left * 1000) + 1
        for fd, _ in poller.poll(timeout_ms):
            if reading.take(fd) is False:
                poller.unregister(fd)
    return reading.result(host_deadline_hit=False)


async def _until_status_async(out_fd: int, err_fd: int, status_fd: int, *, cap: int, deadline_s: float | None) -> _Read:
    """:func:`_until_status`, waiting on the event loop (readers on the three pipes) instead of poll()."""
    loop = asyncio.get_running_loop()
    reading = _Reading(out_fd, err_fd, status_fd, cap)
    waiter = _Waiter()
    for fd in reading.fds:
        loop.add_reader(fd, waiter.wake)
    hit = False
    try:
        while not reading.complete:
            got_any = False
            for fd in [fd for fd in reading.fds if fd in reading.open_fds]:
                taken = reading.take(fd)
                if taken is None:
                    continue
                got_any = True
                if taken is False:
                    loop.remove_reader(fd)
                if reading.complete:
                    break
            if got_any:
                continue
            left = None if deadline_s is None else deadline_s - time.monotonic()
            if left is not None and left <= 0:
                hit = True
                break
            await waiter.wait(loop, left)
    finally:
        for fd in reading.open_fds:
            loop.remove_reader(fd)
    return reading.result(host_deadline_hit=hit)


class _Waiter:
    """One coroutine's wait for a reader callback or a timeout (cheaper than wait_for, which makes a task)."""

    def __init__(self) -> None:
        self._future: asyncio.Future[None] | None = None

    def wake(self) -> None:
        """Called by the loop when a pipe is ready (or the time is up)."""
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    async def wait(self, loop: asyncio.AbstractEventLoop, timeout_s: float | None) -> None:
        """Until :meth:`wake`, or ``timeout_s`` (None: no limit)."""
        self._future = loop.create_future()
        timer = loop.call_later(timeout_s, self.wake) if timeout_s is not None else None
        try:
            await self._future
        finally:
            self._future = None
            if timer is not None:
                timer.cancel()


def _drain(bufs: dict[int, CappedBuffer], open_fds: set[int]) -> None:
    """The command has exited: take what its pipes already hold, no more (bounded in time, since a
    background writer may keep them full)."""
    drain_until = time.monotonic() + _DRAIN_S
    for fd, buf in bufs.items():
        while fd in open_fds and time.monotonic() < drain_until:
            chunk = _read(fd)
            if chunk == b"":
                open_fds.discard(fd)
            if not chunk:
                break
            buf.add(chunk)


def _read(fd: int, size: int = _READ_SIZE) -> bytes | None:
    """Up to one chunk; b"" at end of file, None when nothing is there yet."""
    try:
        return os.read(fd, size)
    except BlockingIOError:
        return None
