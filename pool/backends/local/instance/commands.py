"""A local sandbox's commands: what may be passed on, the EXEC request, and its result.

The checks mirror what execve() and the daemon accept, so a command that cannot be run is
refused here with the reason, before anything starts in the sandbox.
"""

from __future__ import annotations

import errno
import os
import posixpath
import time
from collections.abc import Mapping
from typing import Protocol

from pool.backends.local.daemon.client import Fields, Op
from pool.backends.local.instance import capture, shellsession
from pool.backends.local.instance.link import NOT_STARTED, SandboxLink
from pool.errors import CommandRejectedError, SandboxCrashedError, SandboxOutOfMemoryError, UnsupportedError
from pool.results import ExecResult, decode_output

# execve() refuses a single argument or variable longer than this (MAX_ARG_STRLEN).
MAX_COMMAND_BYTES = 128 * 1024 - 1
# execve() refuses more than about a quarter of the stack limit in arguments and
# variables together, and the daemon takes requests up to 1 MiB: stay under both.
MAX_EXEC_BYTES = 960 * 1024
HOST_GRACE_S = 10.0
"""How long past a command's timeout the host waits for its status before it stops reading."""


class Stream(Protocol):
    """One captured output stream: its bytes (up to the cap) and whether more were cut."""

    truncated: bool

    def value(self) -> bytes: ...


def check_command(command: str, timeout_s: float | None) -> None:
    """Refuse what no shell can receive: not a str, a NUL byte, over the size limit, a timeout <= 0."""
    if not isinstance(command, str):
        raise CommandRejectedError(f"a command must be a str, got {type(command).__name__}")
    if "\0" in command:
        raise CommandRejectedError("the command contains a NUL byte, which no shell can receive")
    if len(command.encode("utf-8", "surrogateescape")) > MAX_COMMAND_BYTES:
        raise CommandRejectedError(
            f"the command is {len(command.encode('utf-8', 'surrogateescape'))} bytes; the limit is "
            f"{MAX_COMMAND_BYTES}: write large scripts with write_file() or pass data on stdin"
        )
    if timeout_s is not None and not timeout_s > 0:
        raise CommandRejectedError(f"timeout_s must be positive, got {timeout_s}")


def resolve(workdir: str, path: str) -> str:
    """``path`` inside the sandbox as an absolute, normalized path (relative to ``workdir``).

    Raises:
        CommandRejectedError: the path is not a non-empty str without NUL bytes.
    """
    if not isinstance(path, str) or "\0" in path or not path:
        raise CommandRejectedError(f"invalid sandbox path {path!r}")
    return posixpath.normpath(posixpath.join(workdir, path))


def exec_fields(
    command: str, *, timeout_s: float | None, cwd: str, env: Mapping[str, str], reap_all: bool
) -> list[tuple[str, str]]:
    """The EXEC request's fields: the command, ``cwd`` (resolved), the whole environment, the timeout.

    ``reap_all``: nothing the command starts outlives it (a sealed sandbox's verifier).

    Raises:
        CommandRejectedError: a variable has an invalid name or value, or the whole is too large.
    """
    fields = [("cmd", command), ("cwd", cwd)]
    fields.append(("timeout_ms", str(int(timeout_s * 1000)) if timeout_s else "0"))
    if reap_all:
        fields.append(("reap_all", "1"))
    total = len(command.encode("utf-8", "surrogateescape"))
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in str(value):
            raise CommandRejectedError(f"environment variable {key!r} has an invalid name or value")
        entry = f"{key}={value}"
        size = len(entry.encode("utf-8", "surrogateescape"))
        if size > MAX_COMMAND_BYTES:
            raise CommandRejectedError(
                f"environment variable {key} is {size} bytes; the kernel takes at most {MAX_COMMAND_BYTES} "
                "per variable: pass large values in a file (write_file) or on stdin"
            )
        total += size + 1
        fields.append(("env", entry))
    if total > MAX_EXEC_BYTES:
        raise CommandRejectedError(
            f"the command and its environment are {total} bytes together; the limit is {MAX_EXEC_BYTES}: "
            "pass large values in files (write_file) or on stdin"
        )
    return fields


def run(
    link: SandboxLink,
    fields: Fields,
    stdin: str | bytes | None,
    *,
    cap: int,
    timeout_s: float | None,
    memory_limit_bytes: int | None,
) -> ExecResult:
    """Send an EXEC request and collect its output and status (see LocalSandbox.exec)."""
    started = time.monotonic()
    stdin_fd = _stdin_fd(stdin)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    st_r, st_w = os.pipe2(os.O_CLOEXEC)
    _send_exec(link, fields, passed=(stdin_fd, out_w, err_w, st_w), kept=(out_r, err_r, st_r))
    got = capture.collect(out_r, err_r, st_r, cap=cap, deadline_s=_host_deadline(started, timeout_s))
    duration = time.monotonic() - started
    if got.status is None:
        link.explain_missing_status()
        # init is alive: the command killed its runner (kill -9 -1), or stopped it past the deadline
        code, timed_out = 137, got.host_deadline_hit
    else:
        code, timed_out, err = got.status
        if code == NOT_STARTED:
            raise_not_started(link, err, memory_limit_bytes)
    return result(code, timed_out, got.stdout, got.stderr, duration)


def open_session(link: SandboxLink, fields: Fields, env: Mapping[str, str]) -> shellsession.ShellSession:
    """Start the persistent shell that ``fields`` (an EXEC of shellsession.COMMAND) describe."""
    fields = [*fields, ("session", "1")]
    control_r, control_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    st_r, st_w = os.pipe2(os.O_CLOEXEC)
    _send_exec(link, fields, passed=(control_r, out_w, err_w, st_w), kept=(control_w, out_r, err_r, st_r))
    return shellsession.ShellSession(control_w, out_r, err_r, st_r, env)


def _send_exec(link: SandboxLink, fields: Fields, *, passed: tuple[int, ...], kept: tuple[int, ...]) -> None:
    """Send an EXEC request handing the daemon ``passed`` (closed here either way: the daemon has its copies).

    ``kept`` are the host's ends of the same pipes; when the request cannot be sent they are closed too.
    """
    try:
        link.send(Op.EXEC, fields, list(passed))
    except BaseException:
        for fd in kept:
            os.close(fd)
        raise
    finally:
        for fd in passed:
            os.close(fd)


def run_step(
    link: SandboxLink,
    session: shellsession.ShellSession,
    command: str,
    *,
    cap: int,
    timeout_s: float | None,
    memory_limit_bytes: int | None,
) -> ExecResult:
    """Run ``command`` as the next step of the persistent shell (see LocalSandbox.shell)."""
    started = time.monotonic()
    deadline = _host_deadline(started, timeout_s)
    got = session.run(
        command.encode("utf-8", "surrogateescape"), timeout_s=timeout_s, cap=cap, host_deadline_s=deadline
    )
    return _step_result(link, got, started, memory_limit_bytes)


async def run_step_async(
    link: SandboxLink,
    session: shellsession.ShellSession,
    command: str,
    *,
    cap: int,
    timeout_s: float | None,
    memory_limit_bytes: int | None,
) -> ExecResult:
    """:func:`run_step` on the running event loop (no thread waits for the step)."""
    started = time.monotonic()
    deadline = _host_deadline(started, timeout_s)
    got = await session.run_async(
        command.encode("utf-8", "surrogateescape"), timeout_s=timeout_s, cap=cap, host_deadline_s=deadline
    )
    return _step_result(link, got, started, memory_limit_bytes)


def _host_deadline(started: float, timeout_s: float | None) -> float | None:
    """When the host stops waiting for a command started at ``started`` (monotonic): past its timeout
    by :data:`HOST_GRACE_S`; None when it has none."""
    return started + timeout_s + HOST_GRACE_S if timeout_s else None


def _step_result(
    link: SandboxLink, got: capture.StepCaptured, started: float, memory_limit_bytes: int | None
) -> ExecResult:
    """The ExecResult of a session's step, or the exception its status record means."""
    if got.status is None:
        link.explain_missing_status()
        code, timed_out = 137, got.host_deadline_hit  # the agent killed or stopped its shell's reaper
    else:
        code, timed_out, err, goes_on = got.status
        if code == NOT_STARTED:
            raise_not_started(link, err, memory_limit_bytes)
        if not goes_on and err == errno.ENOENT:
            raise UnsupportedError(
                f"sandbox {link.runtime.settings.tag}-{link.number} has no bash for a shell session; "
                "run commands with exec()"
            )
    return result(code, timed_out, got.stdout, got.stderr, time.monotonic() - started)


def raise_not_started(link: SandboxLink, err: int, memory_limit_bytes: int | None) -> None:
    """A command could not start (status code -2, ``err`` says why): whose doing, as an exception.

    A command that cannot start for lack of memory while the sandbox's charge is near its limit
    fails by the agent's doing (its processes, or files on its tmpfs), not the host's.
    """
    if err == errno.ENOMEM and link.memory_exhausted(memory_limit_bytes):
        raise SandboxOutOfMemoryError(
            "the sandbox's processes (and its files: tmpfs pages count) used up its memory, so the "
            "command could not start; restore() starts it again"
        )
    raise SandboxCrashedError(f"snapgym could not start the command in the sandbox: {os.strerror(err)}")


def result(code: int, timed_out: bool, stdout: Stream, stderr: Stream, duration_s: float) -> ExecResult:
    """The ExecResult of a finished command."""
    return ExecResult(
        exit_code=code,
        stdout=decode_output(stdout.value()),
        stderr=decode_output(stderr.value()),
        duration_s=duration_s,
        timed_out=timed_out,
        stdout_truncated=stdout.truncated,
        stderr_truncated=stderr.truncated,
    )


def _stdin_fd(stdin: str | bytes | None) -> int:
    if stdin is None:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
    fd = os.memfd_create("snapgym-stdin", os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
