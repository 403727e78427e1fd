"""One sandbox of the local backend: exec, files, snapshot, restore."""

from __future__ import annotations

import errno
import os
import posixpath
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pool.backends.local import capture, shellsession, upperread
from pool.backends.local.cgroups import Limits, SandboxCgroup, memory_of_process
from pool.backends.local.changes import read_changes
from pool.backends.local.daemon import Op, StatusTimeoutError, read_status
from pool.changes import MAX_PATHS, Changes
from pool.errors import (
    BackendError,
    CommandRejectedError,
    FileOperationError,
    SandboxClosedError,
    SandboxCrashedError,
    SandboxError,
    SandboxOutOfMemoryError,
    UnsupportedError,
)
from pool.network.audit import NetworkLog
from pool.network.policy import NetworkPolicy, Phase
from pool.results import ExecResult, decode_output
from pool.snapshots import Snapshot
from pool.verification import VerificationPlan, VerificationReport, VerifyMode

if TYPE_CHECKING:
    from pool.backends.local.backend import LocalBackend

# execve() refuses a single argument or variable longer than this (MAX_ARG_STRLEN).
MAX_COMMAND_BYTES = 128 * 1024 - 1
# execve() refuses more than about a quarter of the stack limit in arguments and
# variables together, and the daemon takes requests up to 1 MiB: stay under both.
MAX_EXEC_BYTES = 960 * 1024
_HOST_GRACE_S = 10.0
_NOT_STARTED = -2  # status code: snapgym could not start the command in the sandbox
_DEATH_NOTICE_S = 2.0
_FILE_OP_TIMEOUT_S = 120.0
_PF_EXITING = 0x4


def _check_command(command: str, timeout_s: float | None) -> None:
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


def _is_exiting(pid: int) -> bool:
    """True while the kernel tears the process down (PF_EXITING, a zombie): it will not answer again."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True  # gone
    return fields[0] in ("Z", "X") or bool(int(fields[6]) & _PF_EXITING)


class LocalSandbox:
    """A sandbox in its own namespaces over a snapshot's read-only layers."""

    def __init__(
        self,
        backend: LocalBackend,
        number: int,
        snapshot: Snapshot,
        cgroup: SandboxCgroup,
        labels: Mapping[str, str],
    ) -> None:
        self._backend = backend
        self.number = number
        """The daemon's number for this sandbox."""
        self._id = f"{backend.tag}-{number}"
        self._labels = dict(labels)
        self._snapshot = snapshot
        self._cgroup = cgroup
        self._closed = False
        self._sealed: VerifyMode | None = None
        self._private: tuple[str, ...] = ()
        """A strict verifier's private directories: they live in the writable layer."""
        self.stage_path = ""
        """Where the sandbox's writable tmpfs is mounted (in its keeper's mount namespace)."""
        self.keeper_pid = 0
        """The host pid of the sandbox's keeper, whose mount namespace holds its stages."""
        self._egress = backend.egress.gatekeeper()
        self._session: shellsession.ShellSession | None = None

    # -- identity ---------------------------------------------------------

    @property
    def id(self) -> str:
        """``<backend tag>-<number>``: unique on this machine while the backend runs."""
        return self._id

    @property
    def labels(self) -> Mapping[str, str]:
        """The labels given at creation plus ``snapgym.owner``."""
        return dict(self._labels)

    def relabel(self, labels: Mapping[str, str]) -> None:
        """Carry ``labels`` from now on (a ready sandbox handed to the create() that asked for them)."""
        self._labels = dict(labels)

    @property
    def start_snapshot(self) -> Snapshot:
        """The snapshot this sandbox last started from (at create or restore)."""
        return self._snapshot

    @property
    def start_digest(self) -> str:
        """Digest of the state this sandbox started from (equal digests: identical starts)."""
        return self._snapshot.digest

    @property
    def is_closed(self) -> bool:
        """True after close()."""
        return self._closed

    @property
    def is_alive(self) -> bool:
        """True while the sandbox's init runs and can take commands."""
        if self._closed or not self._backend.daemon_is_alive:
            return False
        reply = self._backend.daemon_request(Op.PING, self.number, [])
        return reply.get("pid", "0") != "0"

    @property
    def died_of_oom(self) -> bool:
        """True when the sandbox's init died while the OOM killer was at work in its cgroup."""
        if self._closed or not self._backend.daemon_is_alive:
            return False
        return self._backend.daemon_request(Op.PING, self.number, []).get("died") == "oom"

    def use_limits(self, limits: Limits, controllers: set[str]) -> None:
        """Limits for the next instance (set before a restore)."""
        self._cgroup.set_limits(limits, controllers)

    def memory_bytes(self) -> int | None:
        """Memory charged to the sandbox right now, where a memory cgroup exists."""
        return self._cgroup.memory_bytes()

    # -- commands -----------------------------------------------------------

    def exec(
        self,
        command: str,
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run ``command`` with ``/bin/sh -c`` as root inside the sandbox.

        Args:
            command: shell source; at most 128 KiB (pass data with ``stdin``).
            timeout_s: kill the command and everything it started after this
                long (default: the backend's ``default_timeout_s``).
            cwd: working directory (default: the snapshot's workdir).
            env: variables added to the snapshot's environment (and to the
                proxy's, after :meth:`set_network`).
            stdin: data on standard input (default: empty).
            max_output_bytes: cap per stream (default: the backend's).

        Returns:
            The ExecResult; a non-zero exit or a timeout is data, not an error.

        Raises:
            CommandRejectedError: the command, env or cwd cannot be passed on.
            SandboxClosedError: the sandbox was closed.
            SandboxCrashedError: the sandbox died; restore() brings it back.
        """
        self._check_open()
        if self._egress.environment:
            env = {**self._egress.environment, **(env or {})}
        fields = self._exec_fields(command, timeout_s, cwd, env)
        cap = max_output_bytes if max_output_bytes is not None else self._backend.max_output_bytes
        timeout = timeout_s if timeout_s is not None else self._backend.default_timeout_s
        started = time.monotonic()
        stdin_fd = self._stdin_fd(stdin)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        try:
            self._backend.daemon_send(Op.EXEC, self.number, fields, [stdin_fd, out_w, err_w, st_w])
        except BaseException:
            for fd in (out_r, err_r, st_r):
                os.close(fd)
            raise
        finally:
            for fd in (stdin_fd, out_w, err_w, st_w):
                os.close(fd)
        deadline = started + timeout + _HOST_GRACE_S if timeout else None
        got = capture.collect(out_r, err_r, st_r, cap=cap, deadline_s=deadline)
        duration = time.monotonic() - started
        if got.status is None:
            self._explain_missing_status()
            # init is alive: the command killed its runner (kill -9 -1), or stopped it past the deadline
            code, timed_out = 137, got.host_deadline_hit
        else:
            code, timed_out, err = got.status
            if code == _NOT_STARTED:
                self._raise_not_started(err)
        return ExecResult(
            exit_code=code,
            stdout=decode_output(got.stdout.value()),
            stderr=decode_output(got.stderr.value()),
            duration_s=duration,
            timed_out=timed_out,
            stdout_truncated=got.stdout.truncated,
            stderr_truncated=got.stderr.truncated,
        )

    def shell(
        self,
        command: str,
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run ``command`` in the sandbox's persistent bash, as the next line typed into a terminal.

        The shell starts at the first call (in the snapshot's workdir, with ``env``) and keeps its
        working directory, variables and functions between calls until :meth:`restore`,
        :meth:`begin_verification` or :meth:`close`. Commands get ``/dev/null`` on standard input.
        A command that times out ends the shell with everything it started (processes left running
        by earlier commands live on); the next call starts a new shell in the last working
        directory with the last exported variables. See :mod:`pool.backends.local.shellsession`.

        Raises:
            CommandRejectedError: the command holds a NUL byte, is too long, or the timeout is not positive.
            UnsupportedError: the sandbox has no bash (use :meth:`exec`).
            SandboxError: the sandbox is sealed for its verifier.
            SandboxClosedError, SandboxCrashedError: as for :meth:`exec`.
        """
        self._check_open()
        if self._sealed is not None:
            raise SandboxError("the sandbox is sealed for its verifier; the shell is the agent's (use exec())")
        _check_command(command, timeout_s)
        if self._egress.environment:
            env = {**self._egress.environment, **(env or {})}
        timeout = timeout_s if timeout_s is not None else self._backend.default_timeout_s
        cap = max_output_bytes if max_output_bytes is not None else self._backend.max_output_bytes
        session = self._session
        if session is None or not session.alive or session.env != dict(env or {}):
            session = self._start_session(env or {})
        started = time.monotonic()
        host_deadline = started + timeout + _HOST_GRACE_S if timeout else None
        got = session.run(command.encode("utf-8", "surrogateescape"), timeout_s=timeout, cap=cap,
                          host_deadline_s=host_deadline)  # fmt: skip
        if got.status is None:
            self._explain_missing_status()
            code, timed_out = 137, got.host_deadline_hit  # the agent killed or stopped its shell's reaper
        else:
            code, timed_out, err, goes_on = got.status
            if code == _NOT_STARTED:
                self._raise_not_started(err)
            if not goes_on and err == errno.ENOENT:
                raise UnsupportedError(f"sandbox {self.id} has no bash for a shell session; run commands with exec()")
        return ExecResult(
            exit_code=code,
            stdout=decode_output(got.stdout.value()),
            stderr=decode_output(got.stderr.value()),
            duration_s=time.monotonic() - started,
            timed_out=timed_out,
            stdout_truncated=got.stdout.truncated,
            stderr_truncated=got.stderr.truncated,
        )

    def _start_session(self, env: Mapping[str, str]) -> shellsession.ShellSession:
        self._end_session()
        fields = self._exec_fields(shellsession.COMMAND, None, None, env)
        fields.append(("session", "1"))
        control_r, control_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        try:
            self._backend.daemon_send(Op.EXEC, self.number, fields, [control_r, out_w, err_w, st_w])
        except BaseException:
            for fd in (control_w, out_r, err_r, st_r):
                os.close(fd)
            raise
        finally:
            for fd in (control_r, out_w, err_w, st_w):
                os.close(fd)
        self._session = shellsession.ShellSession(control_w, out_r, err_r, st_r, env)
        return self._session

    def _end_session(self) -> None:
        """Hang up the shell session, if any (its shell exits once idle)."""
        if self._session is not None:
            self._session.close()
            self._session = None

    def _exec_fields(
        self, command: str, timeout_s: float | None, cwd: str | None, env: Mapping[str, str] | None
    ) -> list[tuple[str, str]]:
        _check_command(command, timeout_s)
        timeout = timeout_s if timeout_s is not None else self._backend.default_timeout_s
        merged = dict(self._backend.base_env(self._snapshot))
        merged.update(self._snapshot.env)
        merged.update(env or {})
        fields = [("cmd", command), ("cwd", self._resolve(cwd or self._snapshot.workdir))]
        fields.append(("timeout_ms", str(int(timeout * 1000)) if timeout else "0"))
        if self._sealed is not None:
            fields.append(("reap_all", "1"))  # nothing the verifier's command starts outlives it
        total = len(command.encode("utf-8", "surrogateescape"))
        for key, value in merged.items():
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

    def _raise_not_started(self, err: int) -> None:
        """A command could not start (status code -2, ``err`` says why): whose doing, as an exception."""
        if err == errno.ENOMEM and self.memory_exhausted():
            raise SandboxOutOfMemoryError(
                "the sandbox's processes (and its files: tmpfs pages count) used up its memory, so the "
                "command could not start; restore() starts it again"
            )
        raise SandboxCrashedError(f"snapgym could not start the command in the sandbox: {os.strerror(err)}")

    def _stdin_fd(self, stdin: str | bytes | None) -> int:
        if stdin is None:
            return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
        fd = os.memfd_create("snapgym-stdin", os.MFD_CLOEXEC)
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def _explain_missing_status(self) -> None:
        """Why a command ended without its status: raise unless its init lives (the command killed or stopped
        its own runner, which is the agent's doing)."""
        if not self._backend.daemon_is_alive:
            raise SandboxCrashedError("the sandbox daemon died; create a new backend")
        reply = self._ping_settled()
        if reply.get("pid", "0") == "0":
            if reply.get("died") == "oom":
                raise SandboxOutOfMemoryError(
                    "the sandbox's processes used up its memory and its init died; restore() starts it again"
                )
            raise SandboxCrashedError(
                "the sandbox's init died (killed from the host); restore() starts it again from its snapshot"
            )

    def memory_exhausted(self) -> bool:
        """True when the sandbox's memory charge is within 10% of its limit: a command that cannot start
        for lack of memory then fails by the agent's doing (its processes, or files on its tmpfs), not the host's."""
        limit = self._cgroup.limits.memory_bytes
        if not limit:
            return False
        try:
            pid = int(self._backend.daemon_request(Op.PING, self.number, []).get("pid", "0"))
        except BackendError:
            return False
        used = memory_of_process(pid) if pid > 0 else None  # the current instance's cgroup, not a dead one's
        return used is not None and used >= 0.9 * limit

    def init_died_of_oom(self) -> bool:
        """True when the sandbox's init is gone because its processes used up its memory."""
        try:
            reply = self._ping_settled()
        except BackendError:
            return False
        return reply.get("pid", "0") == "0" and reply.get("died") == "oom"

    def _ping_settled(self) -> dict[str, str]:
        """The keeper's word on the init, once a dying init (whose pipes close first) has been reaped."""
        deadline = time.monotonic() + _DEATH_NOTICE_S
        while True:
            reply = self._backend.daemon_request(Op.PING, self.number, [])
            if reply.get("pid", "0") == "0" or time.monotonic() > deadline:
                return reply
            if not _is_exiting(int(reply["pid"])):
                return reply
            time.sleep(0.005)

    def changes(self, *, max_paths: int = MAX_PATHS) -> Changes:
        """The paths added, changed and removed since the sandbox started, read on the host from
        its writable layer (see pool.backends.local.changes); nothing runs in the sandbox."""
        self._check_open()
        layers = self._backend.store.layers
        return read_changes(
            self._backend.stage_dir(self) / "upper",
            [layers.path(layer_id) for layer_id in self.start_snapshot.layers],
            rootless=self._backend.rootless,
            max_paths=max_paths,
        )

    # -- files --------------------------------------------------------------

    def read_file(self, path: str, *, max_bytes: int | None = None, follow_symlinks: bool = True) -> bytes:
        """The bytes of a regular file inside the sandbox.

        Args:
            path: absolute, or relative to the snapshot's workdir.
            max_bytes: refuse a larger file (EFBIG).
            follow_symlinks: False refuses a link as the last component (ELOOP).

        Raises:
            FileOperationError: missing, a directory, not a regular file (a FIFO,
                say), unreadable, or larger than ``max_bytes``; ``.errno`` says which.
        """
        self._check_open()
        resolved = self._resolve(path)
        if any(resolved.startswith(d + "/") for d in self._private):  # a strict verifier's: no process needed
            data = upperread.read(self._backend.stage_dir(self) / "upper", resolved, max_bytes)
            if data is not None:
                return data
        out = os.memfd_create("snapgym-read", os.MFD_CLOEXEC)
        try:
            fields = [("path", resolved), ("max", str(max_bytes or 0))]
            if not follow_symlinks:
                fields.append(("nofollow", "1"))
            self._file_op(Op.READ, fields, out, path)
            os.lseek(out, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(out, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(out)

    def write_file(self, path: str, data: str | bytes, *, mode: int | None = None) -> None:
        """Write a file inside the sandbox, creating parent directories.

        Raises:
            FileOperationError: the path cannot be written; ``.errno`` says why.
        """
        self._check_open()
        content = data.encode() if isinstance(data, str) else bytes(data)
        src = os.memfd_create("snapgym-write", os.MFD_CLOEXEC)
        try:
            os.write(src, content)
            fields = [("path", self._resolve(path))]
            if mode is not None:
                fields.append(("mode", f"{mode:o}"))
            self._file_op(Op.WRITE, fields, src, path)
        finally:
            os.close(src)

    def _file_op(self, op: Op, fields: list[tuple[str, str]], data_fd: int, path: str) -> None:
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        try:
            try:
                self._backend.daemon_send(op, self.number, fields, [data_fd, st_w])
            finally:
                os.close(st_w)
            try:
                status = read_status(st_r, _FILE_OP_TIMEOUT_S)
            except StatusTimeoutError:
                self._explain_missing_status()
                raise FileOperationError(
                    errno.ETIMEDOUT,
                    f"the file operation on {path} did not finish in {_FILE_OP_TIMEOUT_S:g} s "
                    "(a process of the sandbox stopped it?)",
                    path,
                ) from None
        finally:
            os.close(st_r)
        if status is None:
            self._explain_missing_status()  # init lives: a process of the sandbox killed the file helper
            raise FileOperationError(errno.EIO, f"the file operation on {path} was killed inside the sandbox", path)
        code, _, err = status
        if code == _NOT_STARTED:
            raise SandboxCrashedError(f"snapgym could not reach the sandbox's files: {os.strerror(err)}")
        if err:
            verb = "read" if op is Op.READ else "write"
            raise FileOperationError(err, f"cannot {verb} {path} in the sandbox: {os.strerror(err)}", path)

    def _resolve(self, path: str) -> str:
        if not isinstance(path, str) or "\0" in path or not path:
            raise CommandRejectedError(f"invalid sandbox path {path!r}")
        return posixpath.normpath(posixpath.join(self._snapshot.workdir, path))

    # -- lifecycle ----------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Freeze the current files into an immutable Snapshot (processes are not kept)."""
        self._check_open()
        if self._sealed is not None:
            raise SandboxError("the sandbox is sealed for its verifier; restore() it before taking a snapshot")
        return self._backend.snapshot_sandbox(self)

    def restore(self, snapshot: Snapshot | None = None) -> None:
        """Kill every process and go back to ``snapshot`` (default: the last start).

        Nothing of the snapshot is copied: the writable layer is discarded and
        fresh namespaces start over the same read-only layers. Returns once every
        process of the previous episode is gone; the next one gets fresh cgroups.
        Ends a verification (see :meth:`begin_verification`).
        """
        self._check_open()
        self._end_session()
        target = snapshot or self._snapshot
        self._sealed, self._private = None, ()
        self._egress.detach()  # before the instance goes: its namespace can then be reused
        self._egress.log()  # the last episode's records go with it
        self._backend.restart_sandbox(self, target)
        self._snapshot = target

    def begin_verification(self, plan: VerificationPlan) -> VerificationReport:
        """End the agent's turn: from now until restore(), commands run the verifier's way.

        See pool.verification for what ``strict`` and ``shared`` guarantee.

        Raises:
            ConfigError: the plan does not fit this sandbox (it did not start from
                ``plan.known_good`` or a checkpoint of it).
            SandboxError: the sandbox is sealed already, or the verifier could not start.
        """
        self._check_open()
        if self._sealed is not None:
            raise SandboxError("the sandbox is sealed for its verifier already; restore() it first")
        self._end_session()
        if plan.mode is VerifyMode.STRICT:
            self._egress.detach()  # the agent's instance ends; the verifier's gets its own gate
        else:
            self._egress.seal()  # same namespace: nothing goes out until the verifier's policy is set
        report = self._backend.seal_sandbox(self, plan)
        self._sealed = plan.mode
        if plan.mode is VerifyMode.STRICT:
            self._private = plan.private_dirs
        return report

    # -- network ----------------------------------------------------------

    def set_network(self, policy: NetworkPolicy, *, phase: Phase) -> dict[str, str]:
        """Until restore(), reach only what ``policy`` allows, through the backend's egress proxy.

        The proxy listens at 127.0.0.1:3128 inside the sandbox's network namespace
        (see pool.egress); every command gets ``HTTP_PROXY`` and friends pointing there.

        Raises:
            UnsupportedError: a rootless backend and a policy other than no-network.
            SandboxCrashedError: the sandbox is not running.
        """
        self._check_open()
        if not self._backend.egress.available:
            if policy.allows_any:
                raise UnsupportedError(self._backend.egress.unavailable_reason)
            return {}
        reply = self._backend.daemon_request(Op.PING, self.number, [])
        if reply.get("pid", "0") == "0":
            raise SandboxCrashedError(f"sandbox {self.id} is not running; restore() it first")
        return self._egress.apply(
            f"/proc/{reply['pid']}/ns/net", policy, phase, read_file=self._read_optional, write_file=self._write_bytes
        )

    def network_log(self) -> NetworkLog:
        """The connection attempts since the last call or restore (see pool.network.audit)."""
        return self._egress.log()

    def _read_optional(self, path: str) -> bytes | None:
        try:
            return self.read_file(path, max_bytes=16 << 20)
        except FileOperationError:
            return None

    def _write_bytes(self, path: str, data: bytes) -> None:
        self.write_file(path, data, mode=0o644)

    @property
    def sealed(self) -> VerifyMode | None:
        """The verification mode in force since begin_verification(), or None."""
        return self._sealed

    def freeze(self) -> None:
        """Stop every process of the sandbox (SIGSTOP) until thaw()."""
        self._signal_all(Op.FREEZE)

    def thaw(self) -> None:
        """Let the processes stopped by freeze() run again."""
        self._signal_all(Op.THAW)

    def _signal_all(self, op: Op) -> None:
        self._check_open()
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        try:
            try:
                self._backend.daemon_send(op, self.number, [], [st_w])
            finally:
                os.close(st_w)
            if read_status(st_r) is None:
                self._explain_missing_status()
        finally:
            os.close(st_r)

    def close(self) -> None:
        """Kill the sandbox and free its writable layer and cgroup. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._end_session()
        self._egress.detach()
        self._backend.release_sandbox(self)
        self._cgroup.remove()

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError(f"sandbox {self.id} is closed; create a new one from the backend")

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<LocalSandbox {self.id} {state} snapshot={self._snapshot.id[:12]}>"
