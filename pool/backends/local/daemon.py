"""The host side of the sandbox daemon: start it, frame requests, read replies.

The wire format is documented at the top of ``sandboxd.c``.
"""

from __future__ import annotations

import array
import enum
import os
import socket
import struct
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from pool.errors import BackendError, SandboxCrashedError


class Op(enum.IntEnum):
    """Request and reply codes shared with sandboxd.c."""

    CREATE = 1
    RESTORE = 2
    EXEC = 3
    CLOSE = 4
    READ = 5
    WRITE = 6
    FREEZE = 7
    THAW = 8
    PING = 9
    OK = 100
    ERR = 101


STATUS_SIZE = 16
Fields = Sequence[tuple[str, str]]


def encode(op: Op, sandbox_id: int, fields: Fields) -> bytes:
    """One request packet."""
    parts = [struct.pack("=III", op, sandbox_id, len(fields))]
    for key, value in fields:
        data = f"{key}={value}".encode("utf-8", "surrogateescape")
        parts.append(struct.pack("=I", len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_status(record: bytes) -> tuple[int, bool, int]:
    """(code, timed_out, errno) from a status record."""
    code, timed_out, err, _ = struct.unpack("=iiii", record)
    return code, bool(timed_out), err


class DaemonClient:
    """A running sandboxd and the socket to it. Thread-safe."""

    def __init__(self, binary: Path, *, rootless: bool, stage_dir: Path, log_path: Path) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        self._log_path = log_path
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [str(binary), "user" if rootless else "root", str(stage_dir), str(child.fileno())],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                close_fds=True,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            )
        child.close()
        self._sock = parent
        self._lock = threading.Lock()
        self._closed = False
        try:
            self.request(Op.PING, 0, [])
        except SandboxCrashedError as exc:
            raise BackendError(f"the sandbox daemon failed to start: {self.log_tail() or exc}") from None

    @property
    def pid(self) -> int:
        """Process id of the daemon."""
        return self._proc.pid

    @property
    def is_alive(self) -> bool:
        """True while the daemon process runs."""
        return not self._closed and self._proc.poll() is None

    def log_tail(self, limit: int = 2000) -> str:
        """The end of the daemon's stderr log, for error messages."""
        try:
            return self._log_path.read_text(errors="replace")[-limit:].strip()
        except OSError:
            return ""

    def request(self, op: Op, sandbox_id: int, fields: Fields) -> str:
        """Send a control request and wait for its reply; returns the reply text.

        Raises:
            BackendError: the daemon answered with an error.
            SandboxCrashedError: the daemon is gone.
        """
        packet = encode(op, sandbox_id, fields)
        with self._lock:
            try:
                self._sock.sendall(packet)
                reply = self._sock.recv(1 << 16)
            except OSError as exc:
                raise SandboxCrashedError(f"the sandbox daemon is gone ({exc}); create a new backend") from None
        if not reply:
            raise SandboxCrashedError(f"the sandbox daemon exited; its log says: {self.log_tail() or '(nothing)'}")
        code, _, nfields = struct.unpack_from("=III", reply)
        text = ""
        if nfields:
            (length,) = struct.unpack_from("=I", reply, 12)
            text = reply[16 : 16 + length].decode(errors="replace")
        if code != Op.OK:
            raise BackendError(text)
        return text

    def send(self, op: Op, sandbox_id: int, fields: Fields, fds: Sequence[int]) -> None:
        """Send a request that answers on the passed fds rather than the socket."""
        packet = encode(op, sandbox_id, fields)
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        with self._lock:
            try:
                self._sock.sendmsg([packet], ancillary)
            except OSError as exc:
                raise SandboxCrashedError(f"the sandbox daemon is gone ({exc}); create a new backend") from None

    def close(self) -> None:
        """Stop the daemon; it kills every sandbox it still holds."""
        if self._closed:
            return
        self._closed = True
        self._sock.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def read_status(fd: int) -> tuple[int, bool, int] | None:
    """Block until a status record arrives on fd; None if it closed without one."""
    data = b""
    while len(data) < STATUS_SIZE:
        chunk = os.read(fd, STATUS_SIZE - len(data))
        if not chunk:
            return None
        data += chunk
    return decode_status(data)
