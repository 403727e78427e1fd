"""The local backend's persistent shell: one bash per episode, and a step is a write to it.

A step through :meth:`LocalSandbox.exec` starts a reaper, ``sh`` and ``bash``; a step through
a session costs a write to a shell that is already running, as typing into a terminal does.
The sandbox side (``sandboxd/instance/session.c``) relays each step to the shell, enforces the step's
deadline and kills what the step started when it passes; processes that earlier steps left
running live on. The shell writes each step's exit code on its descriptor 3, which the
sandbox side passes back as a status record.

What carries over between steps: everything a terminal keeps (working directory, variables,
functions, options). The working directory and the exported variables are also written to
:data:`STATE_FILE` after every step, so when the shell ends (``exit``, a step that timed out)
the next step's new shell starts where the last one was. The shell is the agent's own: what
it reports about its own steps (output, exit codes) is the agent's to forge, which changes
nothing but its own observations; deadlines and the reward are enforced outside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import struct
import time
from collections.abc import Mapping
from typing import Literal

from pool.backends.local.instance import capture
from pool.contract import SHELL_STATE_FILE as STATE_FILE
from pool.results import CappedBuffer

COMMAND = f"""\
printf 'R\\n' >&3
[ -f {STATE_FILE} ] && . {STATE_FILE} 2>/dev/null
while IFS= read -r -d '' __snapgym_action; do
  eval "$__snapgym_action" </dev/null
  __snapgym_rc=$?
  {{ printf 'cd %q\\n' "$PWD"; export -p; }} > {STATE_FILE} 2>/dev/null
  printf '%d\\n' "$__snapgym_rc" >&3
done
"""
"""What the session's reaper runs with ``bash --noprofile --norc -c`` (no bash: the session never gets ready)."""
Sent = Literal["sent", "gone", "stuck"]
"""How writing a step ended: all written, the session process gone, or no room before the deadline."""
_HEADER = struct.Struct("=II")
_CONTROL_PIPE_BYTES = 1 << 20
"""Room for any step (commands are at most 128 KiB) in the pipe to the sandbox, so writing one never waits."""


class ShellSession:
    """One running shell in a sandbox, with the host's ends of its pipes."""

    def __init__(self, control_fd: int, out_fd: int, err_fd: int, status_fd: int, env: Mapping[str, str]) -> None:
        self._control, self._out, self._err, self._status = control_fd, out_fd, err_fd, status_fd
        self.env = dict(env)
        """The variables the shell started with (a step that asks for others gets a new shell)."""
        for fd in (out_fd, err_fd, status_fd, control_fd):
            os.set_blocking(fd, False)
        with contextlib.suppress(OSError):  # over the user's pipe quota: large steps go in parts (see run)
            fcntl.fcntl(control_fd, fcntl.F_SETPIPE_SZ, _CONTROL_PIPE_BYTES)
        self.alive = True
        """False once the shell ended or its pipes broke: the next step needs a new session."""

    def run(
        self, command: bytes, *, timeout_s: float | None, cap: int, host_deadline_s: float | None
    ) -> capture.StepCaptured:
        """Send one step and collect its output and status (``command`` without NUL bytes; a
        ``timeout_s`` of None: no deadline).

        The session ends (``alive`` turns False) when the shell exits, the step times out, or the
        sandbox side stops answering before ``host_deadline_s`` (monotonic).
        """
        if self._send(_packet(command, timeout_s), host_deadline_s) == "stuck":
            return self._stuck(cap)
        # sent, or the session had already ended: then its last status record (why) is in the pipe
        got = capture.collect_step(self._out, self._err, self._status, cap=cap, deadline_s=host_deadline_s)
        return self._settled(got)

    async def run_async(
        self, command: bytes, *, timeout_s: float | None, cap: int, host_deadline_s: float | None
    ) -> capture.StepCaptured:
        """:meth:`run` on the running event loop: writing the step and waiting for its output hold no thread."""
        if await self._send_async(_packet(command, timeout_s), host_deadline_s) == "stuck":
            return self._stuck(cap)
        got = await capture.collect_step_async(self._out, self._err, self._status, cap=cap, deadline_s=host_deadline_s)
        return self._settled(got)

    def _stuck(self, cap: int) -> capture.StepCaptured:
        """The sandbox side stopped taking steps (no step can start): the session ends, with nothing to show."""
        self.close()
        return capture.StepCaptured(CappedBuffer(cap), CappedBuffer(cap), None)

    def _settled(self, got: capture.StepCaptured) -> capture.StepCaptured:
        """``got``, once the session is ended if the step ended it (no status, the shell gone, a stream closed)."""
        if got.status is None or not got.status[3] or not got.streams_open:
            self.close()
        return got

    async def _send_async(self, packet: bytes, deadline_s: float | None) -> Sent:
        """:meth:`_send`, waiting for room in the pipe on the event loop."""
        loop, view = asyncio.get_running_loop(), memoryview(packet)
        while view:
            try:
                view = view[os.write(self._control, view) :]
            except BlockingIOError:
                pass
            except BrokenPipeError:
                return "gone"
            if view:
                left = None if deadline_s is None else deadline_s - time.monotonic()
                if left is not None and left <= 0:
                    return "stuck"
                room = loop.create_future()
                loop.add_writer(self._control, room.set_result, None)
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(room, left)
                finally:
                    loop.remove_writer(self._control)
        return "sent"

    def _send(self, packet: bytes, deadline_s: float | None) -> Sent:
        """Write the whole packet, waiting for room until ``deadline_s``: "gone" when the session
        process has ended (its end of the pipe is closed), "stuck" when the deadline passed first."""
        view = memoryview(packet)
        poller = select.poll()
        poller.register(self._control, select.POLLOUT)
        while view:
            try:
                view = view[os.write(self._control, view) :]
            except BlockingIOError:
                pass
            except BrokenPipeError:
                return "gone"
            if view:
                left = None if deadline_s is None else deadline_s - time.monotonic()
                if left is not None and left <= 0:
                    return "stuck"
                poller.poll(None if left is None else int(left * 1000) + 1)
        return "sent"

    def close(self) -> None:
        """Hang up: the shell reads end of input and exits once idle. Idempotent."""
        if not self.alive:
            return
        self.alive = False
        for fd in (self._control, self._out, self._err, self._status):
            os.close(fd)


def _packet(command: bytes, timeout_s: float | None) -> bytes:
    """One step as the sandbox side reads it: its timeout in ms (0: none) and length, then the command and a NUL."""
    timeout_ms = max(1, int(timeout_s * 1000)) if timeout_s else 0
    return _HEADER.pack(timeout_ms, len(command) + 1) + command + b"\0"
