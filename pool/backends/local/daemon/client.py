"""The host side of the sandbox daemon: start it, frame requests, match replies.

The wire format is documented in ``sandboxd/sandboxd.h``. Requests carry a
sequence number; a reader thread hands each reply to the request that waits
for it, so many sandboxes can be created or restored at once.
"""

from __future__ import annotations

import array
import enum
import itertools
import os
import select
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from pool.errors import BackendError, SandboxCrashedError


class Op(enum.IntEnum):
    """Request and reply codes shared with sandboxd.h."""

    CREATE = 1
    RESTORE = 2
    EXEC = 3
    CLOSE = 4
    READ = 5
    WRITE = 6
    FREEZE = 7
    THAW = 8
    PING = 9
    SEAL = 10
    OK = 100
    ERR = 101


STATUS_SIZE = 16
_HEADER = struct.Struct("=IIII")
Fields = Sequence[tuple[str, str]]


def encode(op: Op, sandbox_id: int, seq: int, fields: Fields) -> bytes:
    """One request packet."""
    parts = [_HEADER.pack(op, sandbox_id, seq, len(fields))]
    for key, value in fields:
        data = f"{key}={value}".encode("utf-8", "surrogateescape")
        parts.append(struct.pack("=I", len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_status(record: bytes) -> tuple[int, bool, int]:
    """(code, timed_out, errno) from a status record."""
    code, timed_out, err, _ = struct.unpack("=iiii", record)
    return code, bool(timed_out), err


def decode_session_status(record: bytes) -> tuple[int, bool, int, bool]:
    """(code, timed_out, errno, session_goes_on) from a shell session's status record (STATUS_STEP: goes on)."""
    code, timed_out, err, kind = struct.unpack("=iiii", record)
    return code, bool(timed_out), err, kind == 1


class PendingReply:
    """A control request whose reply has not been read yet."""

    def __init__(self, sandbox_id: int) -> None:
        self.sandbox_id = sandbox_id
        self._done = threading.Event()
        self._reply: dict[str, str] | None = None
        self._error: Exception | None = None

    def resolve(self, reply: dict[str, str] | None, error: Exception | None) -> None:
        """Hand over the reply (or the error) and wake the waiter."""
        self._reply, self._error = reply, error
        self._done.set()

    def result(self) -> dict[str, str]:
        """Wait for the reply: its "key=value" fields."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._reply is not None
        return self._reply


class DaemonClient:
    """A running sandboxd and the socket to it. Thread-safe."""

    def __init__(
        self,
        binary: Path,
        *,
        rootless: bool,
        stage_dir: Path,
        log_path: Path,
        netns_stock: int = 0,
        keep_mounts: Sequence[Path] = (),
    ) -> None:
        """Start the daemon ``binary``.

        Args:
            netns_stock: how many new network namespaces it may keep made ahead for new sandboxes
                (``sandboxd/netstock.c``; 0: none).
            keep_mounts: every host path a sandbox's layers or binds lie under (the store, the host
                base's bind sources): the daemon's copy of the host's mounts keeps theirs and drops
                the rest, which every instance would otherwise copy (``sandboxd/hostmounts.c``).
        """
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        self._log_path = log_path
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [
                    str(binary),
                    "user" if rootless else "root",
                    str(stage_dir),
                    str(child.fileno()),
                    str(netns_stock),
                    *map(str, keep_mounts),
                ],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                close_fds=True,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                # Out of the caller's process group: a terminal's Ctrl-C (SIGINT to the whole
                # foreground group) is the program's to answer, with its sandboxes still alive. The
                # daemon still ends with the program: its control socket closes.
                start_new_session=True,
            )
        child.close()
        self._sock = parent
        self._send_lock = threading.Lock()
        self._pending: dict[int, PendingReply] = {}
        self._pending_lock = threading.Lock()
        self._seq = itertools.count(1)
        self._closed = False
        self._gone: Exception | None = None
        self._reader = threading.Thread(target=self._read_replies, name="snapgym-daemon-replies", daemon=True)
        self._reader.start()
        try:
            self.request(Op.PING, 0, [])
        except SandboxCrashedError:
            raise BackendError(f"the sandbox daemon failed to start: {self.log_tail() or 'no message'}") from None

    @property
    def pid(self) -> int:
        """Process id of the daemon."""
        return self._proc.pid

    @property
    def is_alive(self) -> bool:
        """True while the daemon process runs."""
        return not self._closed and self._gone is None and self._proc.poll() is None

    def log_tail(self, limit: int = 2000) -> str:
        """The end of the daemon's stderr log, for error messages."""
        try:
            return self._log_path.read_text(errors="replace")[-limit:].strip()
        except OSError:
            return ""

    def submit(self, op: Op, sandbox_id: int, fields: Fields) -> PendingReply:
        """Send a control request (CREATE, RESTORE, CLOSE, PING); wait with .result()."""
        seq = next(self._seq)
        pending = PendingReply(sandbox_id)
        with self._pending_lock:
            if self._gone is not None:
                raise self._gone
            self._pending[seq] = pending
        try:
            with self._send_lock:
                self._sock.sendall(encode(op, sandbox_id, seq, fields))
        except OSError as exc:
            with self._pending_lock:
                self._pending.pop(seq, None)
            raise SandboxCrashedError(f"the sandbox daemon is gone ({exc}); create a new backend") from None
        return pending

    def request(self, op: Op, sandbox_id: int, fields: Fields) -> dict[str, str]:
        """Send a control request and wait for its reply fields.

        Raises:
            BackendError: the daemon answered with an error.
            SandboxCrashedError: the daemon or the sandbox's keeper is gone.
        """
        return self.submit(op, sandbox_id, fields).result()

    def send(self, op: Op, sandbox_id: int, fields: Fields, fds: Sequence[int]) -> None:
        """Send a request that answers on the passed fds rather than the socket."""
        packet = encode(op, sandbox_id, 0, fields)
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        with self._send_lock:
            try:
                self._sock.sendmsg([packet], ancillary)
            except OSError as exc:
                raise SandboxCrashedError(f"the sandbox daemon is gone ({exc}); create a new backend") from None

    def _read_replies(self) -> None:
        while True:
            try:
                packet = self._sock.recv(1 << 16)
            except OSError:
                packet = b""
            if not packet:
                self._fail_all()
                return
            op, sandbox_id, seq, nfields = _HEADER.unpack_from(packet)
            text = ""
            if nfields:
                (length,) = struct.unpack_from("=I", packet, _HEADER.size)
                text = packet[_HEADER.size + 4 : _HEADER.size + 4 + length].decode(errors="replace")
            if seq == 0:  # an event: this sandbox's keeper died
                self._fail_sandbox(sandbox_id, SandboxCrashedError(f"{text}; close the sandbox and create another"))
                continue
            with self._pending_lock:
                pending = self._pending.pop(seq, None)
            if pending is None:
                continue
            if op == Op.OK:
                pending.resolve(parse_reply(text), None)
            else:
                pending.resolve(None, BackendError(text))

    def _fail_sandbox(self, sandbox_id: int, error: Exception) -> None:
        with self._pending_lock:
            seqs = [seq for seq, p in self._pending.items() if p.sandbox_id == sandbox_id]
            waiting = [self._pending.pop(seq) for seq in seqs]
        for pending in waiting:
            pending.resolve(None, error)

    def _fail_all(self) -> None:
        error = SandboxCrashedError(f"the sandbox daemon exited; its log says: {self.log_tail() or '(nothing)'}")
        with self._pending_lock:
            self._gone = error
            waiting = list(self._pending.values())
            self._pending.clear()
        for pending in waiting:
            pending.resolve(None, error)

    def close(self) -> None:
        """Stop the daemon; it kills every sandbox it still holds."""
        if self._closed:
            return
        self._closed = True
        self._sock.shutdown(socket.SHUT_WR)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=5)
        self._sock.close()


def parse_reply(text: str) -> dict[str, str]:
    """The "key=value" lines of a reply; a key given more than once keeps every value, newline-joined."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            fields[key] = f"{fields[key]}\n{value}" if key in fields else value
    return fields


class StatusTimeoutError(TimeoutError):
    """No status record arrived before the deadline."""


def read_status(fd: int, timeout_s: float | None = None) -> tuple[int, bool, int] | None:
    """Wait for a status record on fd; None if it closed without one.

    Raises:
        StatusTimeoutError: ``timeout_s`` passed first.
    """
    data = b""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while len(data) < STATUS_SIZE:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise StatusTimeoutError(f"no answer within {timeout_s:g} s")
        chunk = os.read(fd, STATUS_SIZE - len(data))
        if not chunk:
            return None
        data += chunk
    return decode_status(data)
