"""One sandbox's line to its instance in the daemon: requests, its init's health, file operations.

A ``SandboxLink`` is a runtime and a sandbox number. What a request's silence means (the agent
killed its own runner, or the init died, of what) is decided here, once for exec, the shell,
file operations and freezing.
"""

from __future__ import annotations

import errno
import os
import time

from pool.backends.local.cgroups import memory_of_process
from pool.backends.local.daemon.client import Fields, Op, StatusTimeoutError, read_status
from pool.backends.local.runtime import Runtime
from pool.errors import BackendError, FileOperationError, SandboxCrashedError, SandboxOutOfMemoryError

NOT_STARTED = -2
"""Status code: snapgym could not start the command in the sandbox."""
_DEATH_NOTICE_S = 2.0
_FILE_OP_TIMEOUT_S = 120.0
_PF_EXITING = 0x4


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (state first), None when it is gone."""
    try:  # os-level: checked several times an episode, and pathlib's read_text costs twice as much
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fields = os.read(fd, 4096).rpartition(b")")[2].split()
    except OSError:
        return None
    finally:
        os.close(fd)
    return fields if len(fields) > 6 else None


def _is_exiting(pid: int) -> bool:
    """True while the kernel tears the process down (PF_EXITING, a zombie): it will not answer again."""
    fields = _stat_fields(pid)
    return fields is None or fields[0] in (b"Z", b"X") or bool(int(fields[6]) & _PF_EXITING)


def is_running_child(pid: int, parent: int) -> bool:
    """True while ``pid`` is a live child of ``parent`` (not exiting, not a zombie): the init a
    reply named is still the one running, and its pid was not handed to another process."""
    fields = _stat_fields(pid)
    return (
        fields is not None
        and fields[0] not in (b"Z", b"X")
        and int(fields[1]) == parent
        and not int(fields[6]) & _PF_EXITING
    )


class SandboxLink:
    """Requests about sandbox ``number`` through ``runtime``, and what their failures mean."""

    def __init__(self, runtime: Runtime, number: int) -> None:
        self.runtime = runtime
        self.number = number

    def request(self, op: Op, fields: Fields) -> dict[str, str]:
        """A control request about this sandbox."""
        return self.runtime.request(op, self.number, fields)

    def send(self, op: Op, fields: Fields, fds: list[int]) -> None:
        """A request about this sandbox, answered on ``fds``."""
        self.runtime.send(op, self.number, fields, fds)

    def ping(self) -> dict[str, str]:
        """The keeper's word on the init: ``pid`` ("0" when none runs) and ``died`` ("oom", ...)."""
        return self.request(Op.PING, [])

    def running_init(self, named: int, keeper: int) -> int:
        """The host pid of the sandbox's init, 0 when none runs.

        ``named``: the init the last start, restore or seal reply named; taken while it still runs as
        ``keeper``'s child (no round trip to the daemon), else the keeper's word once a dying init is reaped.
        """
        if named > 0 and is_running_child(named, keeper):
            return named
        return int(self.ping_settled().get("pid", "0"))

    def ping_settled(self) -> dict[str, str]:
        """The keeper's word on the init, once a dying init (whose pipes close first) has been reaped."""
        deadline = time.monotonic() + _DEATH_NOTICE_S
        while True:
            reply = self.ping()
            if reply.get("pid", "0") == "0" or time.monotonic() > deadline:
                return reply
            if not _is_exiting(int(reply["pid"])):
                return reply
            time.sleep(0.005)

    def explain_missing_status(self) -> None:
        """Why a command ended without its status: raise unless its init lives (the command killed or stopped
        its own runner, which is the agent's doing)."""
        if not self.runtime.daemon_is_alive:
            raise SandboxCrashedError("the sandbox daemon died; create a new backend")
        reply = self.ping_settled()
        if reply.get("pid", "0") == "0":
            if reply.get("died") == "oom":
                raise SandboxOutOfMemoryError(
                    "the sandbox's processes used up its memory and its init died; restore() starts it again"
                )
            raise SandboxCrashedError(
                "the sandbox's init died (killed from the host); restore() starts it again from its snapshot"
            )

    def memory_exhausted(self, limit_bytes: int | None) -> bool:
        """True when the sandbox's memory charge is within 10% of ``limit_bytes``."""
        if not limit_bytes:
            return False
        try:
            pid = int(self.ping().get("pid", "0"))
        except BackendError:
            return False
        used = memory_of_process(pid) if pid > 0 else None  # the current instance's cgroup, not a dead one's
        return used is not None and used >= 0.9 * limit_bytes

    def init_died_of_oom(self) -> bool:
        """True when the sandbox's init is gone because its processes used up its memory."""
        try:
            reply = self.ping_settled()
        except BackendError:
            return False
        return reply.get("pid", "0") == "0" and reply.get("died") == "oom"

    def seal(self, fields: Fields) -> dict[str, str]:
        """The SEAL request that hands the sandbox to its verifier, and its reply.

        Raises:
            SandboxOutOfMemoryError: no verifier could start beside the agent's processes for lack of memory.
            SandboxCrashedError: the sandbox is not running, or its verifier could not start.
        """
        try:
            return self.request(Op.SEAL, fields)
        except BackendError as exc:  # about this sandbox: it is not running, or its verifier could not start
            if str(exc).startswith("out of memory:"):
                raise SandboxOutOfMemoryError(f"no verifier beside the agent's processes: {exc}") from None
            if self.init_died_of_oom():  # e.g. a tmpfs it filled, charged to its memory
                raise SandboxOutOfMemoryError(
                    f"no verifier beside the agent's processes: they used up the sandbox's memory ({exc})"
                ) from None
            raise SandboxCrashedError(f"the verifier could not take over the sandbox: {exc}") from None

    def signal_all(self, op: Op) -> None:
        """FREEZE or THAW every process of the sandbox; returns once the daemon has."""
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        try:
            try:
                self.send(op, [], [st_w])
            finally:
                os.close(st_w)
            if read_status(st_r) is None:
                self.explain_missing_status()
        finally:
            os.close(st_r)

    def read_file(self, resolved: str, path: str, *, max_bytes: int | None, follow_symlinks: bool) -> bytes:
        """The bytes of the regular file at ``resolved`` (``path`` as the caller named it)."""
        out = os.memfd_create("snapgym-read", os.MFD_CLOEXEC)
        try:
            fields = [("path", resolved), ("max", str(max_bytes or 0))]
            if not follow_symlinks:
                fields.append(("nofollow", "1"))
            self.file_op(Op.READ, fields, out, path)
            os.lseek(out, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(out, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(out)

    def write_file(self, resolved: str, path: str, content: bytes, *, mode: int | None) -> None:
        """Write ``content`` to ``resolved`` (``path`` as the caller named it), creating parents."""
        src = os.memfd_create("snapgym-write", os.MFD_CLOEXEC)
        try:
            os.write(src, content)
            fields = [("path", resolved)]
            if mode is not None:
                fields.append(("mode", f"{mode:o}"))
            self.file_op(Op.WRITE, fields, src, path)
        finally:
            os.close(src)

    def file_op(self, op: Op, fields: Fields, data_fd: int, path: str) -> None:
        """READ into, or WRITE from, ``data_fd``; ``path`` as the caller named it, for messages.

        Raises:
            FileOperationError: the operation failed inside the sandbox; ``.errno`` says why.
            SandboxCrashedError, SandboxOutOfMemoryError: the sandbox is not running.
        """
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        try:
            try:
                self.send(op, fields, [data_fd, st_w])
            finally:
                os.close(st_w)
            try:
                status = read_status(st_r, _FILE_OP_TIMEOUT_S)
            except StatusTimeoutError:
                self.explain_missing_status()
                raise FileOperationError(
                    errno.ETIMEDOUT,
                    f"the file operation on {path} did not finish in {_FILE_OP_TIMEOUT_S:g} s "
                    "(a process of the sandbox stopped it?)",
                    path,
                ) from None
        finally:
            os.close(st_r)
        if status is None:
            self.explain_missing_status()  # init lives: a process of the sandbox killed the file helper
            raise FileOperationError(errno.EIO, f"the file operation on {path} was killed inside the sandbox", path)
        code, _, err = status
        if code == NOT_STARTED:
            raise SandboxCrashedError(f"snapgym could not reach the sandbox's files: {os.strerror(err)}")
        if err:
            verb = "read" if op is Op.READ else "write"
            raise FileOperationError(err, f"cannot {verb} {path} in the sandbox: {os.strerror(err)}", path)
