"""Neither a build nor an episode reaches this machine's own services directly: a build with the
network goes out only through the egress proxy (see test_build_network), which refuses loopback."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from pool import LocalBackend, Template


@pytest.fixture()
def host_server() -> Iterator[int]:
    """A one-line TCP server on the host's loopback; yields its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(10)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"package-index\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    server.close()


FETCH = (
    "python3 -c \"import socket; s=socket.create_connection(('127.0.0.1', {port}), timeout=3); "
    'print(s.recv(100).decode().strip())"'
)


def test_a_build_with_the_network_still_cannot_open_a_socket_to_the_host(
    backend: LocalBackend, host_server: int
) -> None:
    from pool import BuildError

    fetch = FETCH.format(port=host_server)
    with pytest.raises(BuildError, match="setup step 1"):
        backend.build(Template(name=f"networked-{host_server}", setup=[f"{fetch} > /fetched"], network=True))


def test_setup_without_network_cannot_reach_the_host(backend: LocalBackend, host_server: int) -> None:
    from pool import BuildError

    fetch = FETCH.format(port=host_server)
    with pytest.raises(BuildError, match="setup step 1"):
        backend.build(Template(name=f"offline-{host_server}", setup=[fetch]))
