"""Sockets that live in a sandbox's network namespace but belong to the host.

A socket belongs to the network namespace it was created in, whoever holds it
afterwards. Creating a listening socket while a helper thread has joined a
sandbox's namespace (``setns(2)`` applies to the calling thread only) gives
the host a listener that the sandbox's processes can connect to at
``127.0.0.1:PORT``, with no process, address or route of ours inside the
sandbox and no way out of it but through that listener. Joining needs
``CAP_SYS_ADMIN`` over the namespace: snapgym run as root has it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import queue
import socket
import threading

from pool.errors import SandboxError, UnsupportedError

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def listen_in_netns(netns_path: str, port: int, *, host: str = "127.0.0.1", backlog: int = 128) -> socket.socket:
    """A TCP socket listening at ``host:port`` inside the network namespace at ``netns_path``
    (e.g. ``/proc/PID/ns/net``).

    The namespace is joined by a helper thread kept for it (one per process, made on first use):
    a sandbox's two listeners per episode then cost no thread start each.

    Raises:
        UnsupportedError: this process may not join the namespace (not root).
        SandboxError: the namespace is gone, or the port is taken in it.
    """
    global _joiner
    with _joiner_lock:
        if _joiner is None or not _joiner.is_usable:
            _joiner = _Joiner()
        outcome = _joiner.listen(netns_path, host, port, backlog)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


_Outcome = socket.socket | BaseException
_Request = tuple[str, str, int, int, "queue.SimpleQueue[_Outcome]"]


class _Joiner:
    """A daemon thread that makes listeners in other network namespaces, one request at a time.

    It goes back to its own namespace after each; if it ever cannot, it stops and is replaced,
    so no later request starts from a sandbox's namespace.
    """

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self.is_usable = True
        self._thread = threading.Thread(target=self._serve, name="snapgym-netns", daemon=True)
        self._thread.start()

    def listen(self, path: str, host: str, port: int, backlog: int) -> _Outcome:
        """The listener, or the error to raise (callers hold the module's lock: one request at a time)."""
        reply: queue.SimpleQueue[_Outcome] = queue.SimpleQueue()
        self._requests.put((path, host, port, backlog, reply))
        return reply.get()

    def _serve(self) -> None:
        failure: UnsupportedError | None = None
        try:
            home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            home, failure = -1, UnsupportedError(f"cannot open this thread's network namespace: {exc.strerror}")
        while True:
            path, host, port, backlog, reply = self._requests.get()
            if failure is not None:
                self.is_usable = False
                reply.put(failure)
                return
            try:
                outcome: _Outcome = _listen_joined(path, host, port, backlog)
            except BaseException as exc:
                outcome = exc
            if _libc.setns(home, CLONE_NEWNET) != 0:  # never seen; the thread must not serve again
                self.is_usable = False
                if isinstance(outcome, socket.socket):
                    outcome.close()
                reply.put(SandboxError("the egress helper thread could not leave a sandbox's network namespace"))
                os.close(home)
                return
            reply.put(outcome)


_joiner: _Joiner | None = None
_joiner_lock = threading.Lock()


def _forget_joiner() -> None:
    """In a forked child the helper thread does not exist: make a new one on first use."""
    global _joiner, _joiner_lock
    _joiner, _joiner_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_joiner)


def _listen_joined(path: str, host: str, port: int, backlog: int) -> socket.socket:
    try:
        target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxError(f"the sandbox's network namespace {path} is gone: {exc.strerror}") from None
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise UnsupportedError(
                f"cannot join the sandbox's network namespace ({os.strerror(err)}): the egress proxy needs root"
            )
    finally:
        os.close(target)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(backlog)
    except OSError as exc:
        listener.close()
        raise SandboxError(f"cannot listen at {host}:{port} in the sandbox: {exc.strerror}") from None
    listener.setblocking(False)
    return listener
