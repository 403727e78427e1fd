"""A bare TCP server for the tests' origins: one thread per connection, until it is closed."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


class TcpServer:
    """Listens on ``(host, a free port)`` and runs ``handle(connection)`` on a thread of its own for
    each client; :meth:`close` stops accepting (connections being handled go on to their end)."""

    def __init__(self, host: str, handle: Callable[[socket.socket], None], *, backlog: int = 64) -> None:
        self.sock = socket.create_server((host, 0), backlog=backlog)
        self.port: int = self.sock.getsockname()[1]
        self._handle = handle
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def close(self) -> None:
        """Stop accepting."""
        self.sock.close()


def read_head(conn: socket.socket) -> bytes:
    """An HTTP request's head (up to the blank line, or what came before the client stopped)."""
    head = b""
    while b"\r\n\r\n" not in head and (chunk := conn.recv(4096)):
        head += chunk
    return head
