"""The persistent interpreter of ``snapgym/Python-v0``; this file runs inside the sandbox.

``python3 repl_server.py serve SOCKET`` keeps one namespace and executes cells
sent to a Unix socket. ``python3 -I -S repl_server.py run SOCKET`` is the
per-step client: it starts the server if needed, sends the cell on stdin
together with its own stdin/stdout/stderr file descriptors, so the cell's
output (and its subprocesses') flows straight into the step's capture, and
exits with the cell's status: 0 ok, 1 an exception (traceback on stderr).

Near the step timeout the client interrupts the cell (KeyboardInterrupt);
if the cell ignores that, it kills the server, and the next cell starts a
fresh interpreter (the client says so on stderr).
"""

from __future__ import annotations

import _socket  # not `socket`: the client must start fast, and `socket` imports a lot
import os
import struct
import sys

_HEADER = struct.Struct("!I")
_FD = struct.Struct("i")
_INTERRUPT_GRACE_S = 2.0
"""How long an interrupted cell has to end (its traceback printed, its status sent) before the
interpreter is killed; on a busy machine half a second was once too little, and the variables went."""
_RESTARTED = "[timed out; the cell ignored the interrupt, so the interpreter was restarted: its variables are gone]\n"


def serve(path: str) -> None:
    """Execute cells from ``path`` forever in one namespace."""
    os.chdir(os.environ.get("SNAPGYM_WORKDIR", "/"))
    namespace: dict[str, object] = {"__name__": "__main__", "__builtins__": __builtins__}
    import socket

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(path):  # left by a checkpoint taken while an earlier server ran
        os.unlink(path)
    listener.bind(path)
    listener.listen(1)
    with open(f"{path}.pid", "w") as pidfile:
        pidfile.write(str(os.getpid()))
    while True:
        conn, _ = listener.accept()
        with conn:
            _serve_one(conn, namespace)


def _serve_one(conn: _socket.socket, namespace: dict[str, object]) -> None:
    message, ancillary, _, _ = conn.recvmsg(_HEADER.size, _socket.CMSG_SPACE(3 * _FD.size))
    fds = [
        _FD.unpack_from(data, offset)[0]
        for level, kind, data in ancillary
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS
        for offset in range(0, len(data) - len(data) % _FD.size, _FD.size)
    ]
    (size,) = _HEADER.unpack(message)
    source = b""
    while len(source) < size:
        chunk = conn.recv(size - len(source))
        if not chunk:
            return
        source += chunk
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    status = _run_cell(source.decode("utf-8", "replace"), namespace)
    sys.stdout.flush()
    sys.stderr.flush()
    for target, fd in enumerate(saved):
        os.dup2(fd, target)
        os.close(fd)
    conn.sendall(bytes([status]))


def _run_cell(source: str, namespace: dict[str, object]) -> int:
    import ast
    import traceback

    try:
        tree = ast.parse(source, "<cell>", "exec")
        last = tree.body[-1] if tree.body else None
        if isinstance(last, ast.Expr):
            tree.body.pop()
            exec(compile(tree, "<cell>", "exec"), namespace)
            value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
            if value is not None:
                print(repr(value))
        else:
            exec(compile(tree, "<cell>", "exec"), namespace)
        return 0
    except BaseException as exc:  # the cell's own errors, including SystemExit and KeyboardInterrupt
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        return 1


def run(path: str, timeout_s: float) -> int:
    """Send stdin as one cell and wait for its status; returns the exit code."""
    source = sys.stdin.buffer.read()
    conn = _connect(path)
    conn.sendmsg([_HEADER.pack(len(source))], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
    conn.sendall(source)
    budget = max(timeout_s - 1.0, 0.5)
    conn.settimeout(budget)
    try:
        reply = conn.recv(1)
    except TimeoutError:
        return _interrupt(conn, path, budget)
    return reply[0] if reply else 1


def _interrupt(conn: _socket.socket, path: str, budget: float) -> int:
    import signal

    with open(f"{path}.pid") as pidfile:
        pid = int(pidfile.read())
    os.kill(pid, signal.SIGINT)
    conn.settimeout(_INTERRUPT_GRACE_S)
    try:
        conn.recv(1)
        sys.stderr.write(f"[timed out after {budget:.0f} s; the cell was interrupted, its variables are kept]\n")
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        os.unlink(path)
        sys.stderr.write(_RESTARTED)
    return 124


def _connect(path: str) -> _socket.socket:
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.connect(path)
        return conn
    except OSError:
        pass
    import subprocess
    import time

    with open(os.devnull, "rb") as null_in, open(os.devnull, "wb") as null_out:
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "serve", path],
            stdin=null_in, stdout=null_out, stderr=null_out, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 10
    while True:
        try:
            conn.connect(path)
            return conn
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit(run(sys.argv[2], float(sys.argv[3])))
