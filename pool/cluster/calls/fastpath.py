"""A same-node shortcut around Ray for the pool's hot calls (exec, acquire, release).

A Ray actor call costs about a millisecond on a small machine, more than an
exec of ``true`` in a sandbox. Actors therefore also serve their methods on a
Unix socket in a private directory (mode 0700, so only the same user can
connect, which is Ray's own trust boundary), and a caller on the same node
uses it: one length-prefixed pickle each way, no scheduler in between.
Callers on other nodes, and every call the shortcut cannot make, go through
Ray. Sandboxes never see the directory (it is on the host, outside any
sandbox's mounts).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import socket
import stat
import struct
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from pool.errors import ConfigError

_LENGTH = struct.Struct("!Q")


class FastPathServer:
    """Serves ``methods`` of an object on a Unix socket, one thread per connection."""

    def __init__(self, target: object, methods: frozenset[str]) -> None:
        self._target = target
        self._methods = methods
        root = _private_root()
        if root is not None:
            _reap_dead(root)
        self._dir = tempfile.mkdtemp(prefix=f"{os.getpid()}-" if root else "snapgym-fastpath-", dir=root)
        self.path = os.path.join(self._dir, "sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(128)
        threading.Thread(target=self._accept, name="snapgym-fastpath", daemon=True).start()

    def close(self) -> None:
        """Stop accepting and remove the socket."""
        with contextlib.suppress(OSError):
            self._listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self._dir)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    frame = _receive_frame(conn)
                except (EOFError, OSError):
                    return
                reply = self._answer(frame)
                try:
                    _send(conn, reply)
                except OSError:
                    return
                except Exception as exc:  # the value does not pickle: say so, and keep the connection
                    _send(conn, ("error", _unpicklable("reply", exc)))

    def _answer(self, frame: bytes) -> tuple[str, Any]:
        try:
            method, args = pickle.loads(frame)
        except Exception as exc:  # e.g. a function its module is not importable here
            return ("error", _unpicklable("call", exc))
        if method not in self._methods:
            return ("error", AttributeError(f"{method} is not served on the fast path"))
        try:
            return ("ok", getattr(self._target, method)(*args))
        except Exception as exc:
            return ("error", exc)


class FastPathClient:
    """Calls a FastPathServer; one connection per calling thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()

    def call(self, method: str, *args: Any) -> Any:
        """Run ``method(*args)`` in the server's process.

        Raises:
            ConnectionError: the server is gone (its process died).
            Exception: whatever the method raised, as itself.
        """
        conn = self._connection()
        try:
            _send(conn, (method, args))
            status, value = _receive(conn)
        except (EOFError, OSError) as exc:
            self._local.conn = None
            with contextlib.suppress(OSError):
                conn.close()
            raise ConnectionError(f"the fast path at {self.path} closed: {exc}") from None
        if status == "error":
            raise value
        return value

    def _connection(self) -> socket.socket:
        conn: socket.socket | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(self.path)
            except OSError as exc:
                conn.close()
                raise ConnectionError(f"cannot reach the fast path at {self.path}: {exc}") from None
            self._local.conn = conn
        return conn


def _private_root() -> str | None:
    """``$TMPDIR/snapgym-fastpath-<uid>``, if it is a real directory only this user can enter.

    Anyone may create names in /tmp: a folder someone else made (or a symlink)
    is never trusted, and each server then falls back to its own random folder.
    """
    root = os.path.join(tempfile.gettempdir(), f"snapgym-fastpath-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
    info = os.lstat(root)
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and info.st_mode & 0o077 == 0:
        return root
    return None


def _reap_dead(root: str) -> None:
    """Remove the socket folders of processes that died without closing their server."""
    for name in os.listdir(root):
        pid = name.split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        except PermissionError:
            pass


def reachable(path: str | None) -> bool:
    """Whether a fast-path socket exists here (so the caller is on the server's node)."""
    return bool(path) and os.path.exists(path or "")


def _send(conn: socket.socket, message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    conn.sendall(_LENGTH.pack(len(data)) + data)


def _receive(conn: socket.socket) -> Any:
    return pickle.loads(_receive_frame(conn))


def _receive_frame(conn: socket.socket) -> bytes:
    header = _read_exactly(conn, _LENGTH.size)
    (size,) = _LENGTH.unpack(header)
    return _read_exactly(conn, size)


def _unpicklable(what: str, exc: Exception) -> ConfigError:
    return ConfigError(
        f"the fast path could not pickle or unpickle the {what} ({type(exc).__name__}: {exc}); what a call "
        f"sends or returns must pickle, and a function must be importable in both processes"
    )


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = conn.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError("connection closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


Caller = Callable[..., Any]
