"""One command in a container, through the helper: the exec protocol on the host side.

``docker exec`` runs ``helper run MS CAP ALL CWD CMD``; the helper's stdout
carries frames (see ``helper.c``) inside Docker's own stream multiplexing:
the command's stdout and stderr (capped by the helper, so a flood costs the
host nothing), the helper's pid, and a last status record (exit code, timed
out, truncation). The sandbox enforces the timeout itself; the host keeps a
backstop some seconds later for a helper the sandbox's own processes stopped,
and then kills the command's tree with ``helper kill``. Stdin, when given, is
written on the exec's attached socket by a thread and half-closed (EOF).

When the engine cannot start the helper at all (the runtime's ``exec`` failed:
a sandbox at its process limit, or a passing fault of the runtime), Docker
writes its error as plain text on the stream and records exit code 126 and no
pid for the exec. Nothing of the command ran then, so it is started once more;
a second refusal is reported with the engine's own words.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pool.backends.docker.images.catalog import env_list
from pool.backends.docker.transport import helper
from pool.backends.docker.transport.engine import engine_errors
from pool.errors import CommandRejectedError, SandboxCrashedError
from pool.results import CappedBuffer

MAX_COMMAND_BYTES = 128 * 1024 - 1
"""execve() refuses a single argument or variable longer than this (MAX_ARG_STRLEN)."""
MAX_EXEC_BYTES = 960 * 1024
"""The command and its environment together, under the kernel's limit for execve()."""
HOST_GRACE_S = 10.0
RETRY_PAUSE_S = 0.1
"""How long to wait before starting a command again that the engine could not start."""
_READ_SIZE = 1 << 16


@dataclass(slots=True)
class Outcome:
    """What came back from one exec through the helper."""

    stdout: CappedBuffer
    stderr: CappedBuffer
    status: tuple[int, bool, bool, bool] | None = None
    """(exit code, timed out, stdout truncated, stderr truncated), or None when the helper died."""
    helper_pid: str | None = None
    host_deadline_hit: bool = False
    not_started: str | None = None
    """The engine's reason when it could not start the helper (nothing of the command ran), else None."""


def check_command(command: str, env: Mapping[str, str], timeout_s: float | None) -> None:
    """Refuse what cannot be passed to a process (the same limits as on the local backend).

    Raises:
        CommandRejectedError: naming the problem and what to do instead.
    """
    if not isinstance(command, str):
        raise CommandRejectedError(f"a command must be a str, got {type(command).__name__}")
    if "\0" in command:
        raise CommandRejectedError("the command contains a NUL byte, which no shell can receive")
    size = len(command.encode("utf-8", "surrogateescape"))
    if size > MAX_COMMAND_BYTES:
        raise CommandRejectedError(
            f"the command is {size} bytes; the limit is {MAX_COMMAND_BYTES}: write large scripts with "
            "write_file() or pass data on stdin"
        )
    if timeout_s is not None and not timeout_s > 0:
        raise CommandRejectedError(f"timeout_s must be positive, got {timeout_s}")
    total = size
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in str(value):
            raise CommandRejectedError(f"environment variable {key!r} has an invalid name or value")
        entry = len(f"{key}={value}".encode("utf-8", "surrogateescape"))
        if entry > MAX_COMMAND_BYTES:
            raise CommandRejectedError(
                f"environment variable {key} is {entry} bytes; the kernel takes at most {MAX_COMMAND_BYTES} "
                "per variable: pass large values in a file (write_file) or on stdin"
            )
        total += entry + 1
    if total > MAX_EXEC_BYTES:
        raise CommandRejectedError(
            f"the command and its environment are {total} bytes together; the limit is {MAX_EXEC_BYTES}: "
            "pass large values in files (write_file) or on stdin"
        )


def run(
    api: Any,
    container: str,
    command: str,
    *,
    cwd: str,
    env: Mapping[str, str],
    timeout_s: float | None,
    stdin: bytes | None,
    cap: int,
    reap_all: bool,
) -> Outcome:
    """Run ``command`` with ``sh -c`` in the container through the helper.

    When the engine could not start the helper (nothing of the command ran), it is started once
    more after :data:`RETRY_PAUSE_S`; a second refusal comes back with ``not_started`` set.

    Raises:
        SandboxCrashedError: the container is not running (409 from the engine).
        HostBrokenError: the engine stopped answering.
    """
    timeout_ms = int(timeout_s * 1000) if timeout_s else 0
    argv = [helper.PATH, "run", str(timeout_ms), str(cap), "1" if reap_all else "0", cwd, command]
    outcome = _run_once(api, container, argv, env=env, timeout_s=timeout_s, stdin=stdin, cap=cap)
    if outcome.not_started is not None:
        time.sleep(RETRY_PAUSE_S)
        outcome = _run_once(api, container, argv, env=env, timeout_s=timeout_s, stdin=stdin, cap=cap)
    return outcome


def _run_once(
    api: Any,
    container: str,
    argv: list[str],
    *,
    env: Mapping[str, str],
    timeout_s: float | None,
    stdin: bytes | None,
    cap: int,
) -> Outcome:
    started = time.monotonic()
    exec_id, attached, sock, early = _start(api, container, argv, stdin=stdin, env=env, doing="starting a command")
    outcome = Outcome(CappedBuffer(cap), CappedBuffer(cap))
    writer = _feed_stdin(sock, stdin) if stdin is not None else None
    deadline = started + timeout_s + HOST_GRACE_S if timeout_s else None
    try:
        with engine_errors("reading a command's output"):
            unframed = _collect(sock, outcome, deadline, early)
    finally:
        if writer is not None:
            writer.join(timeout=1.0)
        with contextlib.suppress(OSError):
            attached.close()
            sock.close()
    if outcome.host_deadline_hit and outcome.helper_pid:
        kill_helper(api, container, outcome.helper_pid)
    if outcome.status is None and outcome.helper_pid is None and not outcome.host_deadline_hit:
        outcome.not_started = _start_failure(api, exec_id, unframed)
    return outcome


def _start_failure(api: Any, exec_id: str, said: bytes) -> str | None:
    """The engine's reason when it never started the exec's process (no pid), else None."""
    with engine_errors("asking the engine about a command"):
        state = api.exec_inspect(exec_id)
    if _started(state):
        return None  # the helper ran and died before its first frame: it may have done something
    text = said.decode("utf-8", "replace").strip()
    return text or f"the engine gave no reason (exit code {state.get('ExitCode')})"


def not_started_message(reason: str) -> str:
    """What a command's stderr says when the engine could not start it, twice: the engine's words, and
    what they usually mean."""
    hint = ""
    if "init-p" in reason or "resource temporarily unavailable" in reason:
        hint = " (the runtime says this when the sandbox is at its process limit: its processes hold every pid)"
    return f"snapgym: the container engine could not start the command: {reason}{hint}\n"


def kill_helper(api: Any, container: str, pid: str) -> None:
    """Kill a command's helper and everything it started (it was stopped from inside the sandbox)."""
    with contextlib.suppress(Exception):
        exec_id = api.exec_create(container, [helper.PATH, "kill", pid])["Id"]
        api.exec_start(exec_id)


def run_helper(api: Any, container: str, args: list[str], *, stdin: bytes | None = None) -> tuple[int, bytes, bytes]:
    """Run one helper operation (not a user command) and wait for it: (exit code, stdout, stderr).

    Started once more when the engine could not start it (as :func:`run`).

    Raises:
        SandboxCrashedError: the container is not running.
    """
    result, started = _run_helper_once(api, container, args, stdin)
    if not started:
        time.sleep(RETRY_PAUSE_S)
        result, _ = _run_helper_once(api, container, args, stdin)
    return result


def _run_helper_once(
    api: Any, container: str, args: list[str], stdin: bytes | None
) -> tuple[tuple[int, bytes, bytes], bool]:
    doing = f"running snapgym's helper ({args[0]})"
    exec_id, attached, sock, early = _start(api, container, [helper.PATH, *args], stdin=stdin, env=None, doing=doing)
    with engine_errors(f"{doing} in the sandbox", missing=_gone):
        writer = _feed_stdin(sock, stdin) if stdin is not None else None
        streams: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        try:
            for kind, payload in _docker_frames(sock, None, Outcome(CappedBuffer(0), CappedBuffer(0)), early):
                streams.get(kind, streams[2]).extend(payload)
        finally:
            if writer is not None:
                writer.join(timeout=1.0)
            attached.close()
            sock.close()
        state = api.exec_inspect(exec_id)
    code = state.get("ExitCode")
    return ((code if isinstance(code, int) else -1), bytes(streams[1]), bytes(streams[2])), _started(state)


def _start(
    api: Any, container: str, argv: list[str], *, stdin: bytes | None, env: Mapping[str, str] | None, doing: str
) -> tuple[str, Any, socket.socket, bytes]:
    """Create and start an exec attached to its stream: its id, the attached connection, its socket, and
    the stream's bytes already read with the response (:func:`read_ahead`). ``doing`` names the
    operation in errors ("starting a command").

    Raises:
        SandboxCrashedError: the container is not running (409 from the engine), or is gone.
        HostBrokenError: the engine stopped answering.
    """
    with engine_errors(f"{doing} in the sandbox", missing=_gone):
        try:
            exec_id = api.exec_create(
                container, argv, stdin=stdin is not None, stdout=True, stderr=True,
                environment=env_list(env) if env is not None else None,
            )["Id"]  # fmt: skip
            attached = api.exec_start(exec_id, socket=True)
        except Exception as exc:
            if getattr(exc, "status_code", None) == 409:
                raise SandboxCrashedError(
                    f"the sandbox's container is not running ({exc}); restore() starts it again"
                ) from None
            raise
    sock: socket.socket = getattr(attached, "_sock", attached)
    return exec_id, attached, sock, read_ahead(attached, sock)


def _started(exec_state: Mapping[str, Any]) -> bool:
    """Whether the engine started an exec's process (it records no pid for one it could not start)."""
    return bool(exec_state.get("Pid")) or bool(exec_state.get("Running"))


def read_ahead(attached: Any, sock: socket.socket) -> bytes:
    """The bytes of the exec's stream that the HTTP client read along with the response's headers.

    docker-py hands over the connection's raw socket, but the response's headers were read through
    a buffered reader, which takes whatever the socket held at that moment: when the client was
    slow to read them (a loaded machine), the start of a fast command's output, or all of it, sits
    in that buffer and would be lost. It is taken from there without waiting for more.
    """
    response = getattr(attached, "_response", None)
    reader = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    if reader is None or not hasattr(reader, "peek"):
        return b""
    timeout = sock.gettimeout()
    sock.setblocking(False)  # peek() reads the socket only when nothing is buffered: then it must not wait
    try:
        held = reader.peek(_READ_SIZE)
        return bytes(reader.read(len(held))) if held else b""
    except (BlockingIOError, ValueError):
        return b""
    finally:
        sock.settimeout(timeout)


def _gone(why: str) -> SandboxCrashedError:
    return SandboxCrashedError(f"the sandbox's container is gone ({why}); create a new sandbox")


def _feed_stdin(sock: socket.socket, data: bytes) -> threading.Thread:
    def feed() -> None:
        with contextlib.suppress(OSError):
            sock.sendall(data)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=feed, name="snapgym-docker-stdin", daemon=True)
    thread.start()
    return thread


def _collect(sock: socket.socket, outcome: Outcome, deadline: float | None, early: bytes) -> bytes:
    """Read the helper's frames until its status record (or the end of the stream, or the backstop).

    Returns the bytes left that are not a whole frame: when the helper never started, the
    engine's own error message.
    """
    pending = b""
    helper_err = bytearray()
    for kind, payload in _docker_frames(sock, deadline, outcome, early):
        if kind != 1:  # the helper's own messages (it could not start the command, ...)
            helper_err.extend(payload[: max(0, 4096 - len(helper_err))])
            continue
        pending += payload
        while len(pending) >= 5:
            (length,) = struct.unpack(">I", pending[1:5])
            if len(pending) < 5 + length:
                break
            tag, body, pending = pending[:1], pending[5 : 5 + length], pending[5 + length :]
            _frame(outcome, tag, body)
            if outcome.status is not None:
                return b""
    if helper_err:
        outcome.stderr.add(bytes(helper_err))
    return pending[:4096]


def _frame(outcome: Outcome, tag: bytes, body: bytes) -> None:
    if tag == b"o":
        outcome.stdout.add(body)
    elif tag == b"e":
        outcome.stderr.add(body)
    elif tag == b"p":
        outcome.helper_pid = body.decode()
    elif tag == b"s":
        code, timed_out, out_cut, err_cut = (int(x) for x in body.split())
        outcome.status = (code, bool(timed_out), bool(out_cut), bool(err_cut))


def _docker_frames(sock: socket.socket, deadline: float | None, outcome: Outcome, early: bytes = b"") -> Any:
    """Docker's multiplexed stream, starting with the ``early`` bytes: (stream number, payload) until EOF
    or the deadline."""
    buffer = early
    while True:
        while len(buffer) >= 8:
            kind = buffer[0]
            (size,) = struct.unpack(">I", buffer[4:8])
            if len(buffer) < 8 + size:
                break
            yield kind, buffer[8 : 8 + size]
            buffer = buffer[8 + size :]
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            outcome.host_deadline_hit = True
            return
        # select, never a blocking recv: the socket carries the client's request timeout, and a
        # command without a timeout may stay silent longer than that
        ready, _, _ = select.select([sock], [], [], left)
        if not ready:
            continue
        chunk = sock.recv(_READ_SIZE)
        if not chunk:
            return
        buffer += chunk
