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
import socket
import threading

from pool.errors import SandboxError, UnsupportedError

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def listen_in_netns(netns_path: str, port: int, *, host: str = "127.0.0.1", backlog: int = 128) -> socket.socket:
    """A TCP socket listening at ``host:port`` inside the network namespace at ``netns_path``
    (e.g. ``/proc/PID/ns/net``).

    Raises:
        UnsupportedError: this process may not join the namespace (not root).
        SandboxError: the namespace is gone, or the port is taken in it.
    """
    result: list[socket.socket | BaseException] = []
    thread = threading.Thread(target=_listen, args=(netns_path, host, port, backlog, result), daemon=True)
    thread.start()
    thread.join()
    outcome = result[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _listen(path: str, host: str, port: int, backlog: int, result: list[socket.socket | BaseException]) -> None:
    try:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        result.append(UnsupportedError(f"cannot open this thread's network namespace: {exc.strerror}"))
        return
    try:
        result.append(_listen_joined(path, host, port, backlog))
    except BaseException as exc:
        result.append(exc)
    finally:
        _libc.setns(home, CLONE_NEWNET)  # the thread ends next, so a failure here changes nothing
        os.close(home)


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
