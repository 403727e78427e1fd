"""Fixtures of the Docker backend's tests: a real engine, a tiny offline image, an engine that can vanish.

Everything the tests make in the engine carries the session's image prefix
(``snapgym-test-<pid>``), so the teardown removes exactly that: the
backends remove their containers, and the images and the helper volume of
the prefix go at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import socketserver
import subprocess
import tarfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pool.backends.docker import DockerBackend
from tests.support.needs import skip_missing

PREFIX = f"snapgym-test-{os.getpid()}"
LIMITS: dict[str, Any] = {"memory_limit_mb": 256, "pids_limit": 64, "image_prefix": PREFIX}
TOOLS = ("sh", "cat", "ls", "echo", "mkdir", "id", "rm", "sleep", "env")


def remove_prefix(prefix: str) -> None:
    """Remove the images and helper volume of a test prefix (after its backends closed)."""
    import docker

    client = docker.from_env()
    try:
        for image in client.images.list():
            for tag in image.tags:
                if tag.startswith(f"{prefix}/"):
                    try:
                        client.images.remove(tag, force=True)
                    except Exception as exc:
                        warnings.warn(f"could not remove the test image {tag}: {exc}", stacklevel=1)
        for volume in client.volumes.list():
            if volume.name.startswith(f"{prefix}-helper-"):
                with contextlib.suppress(Exception):
                    volume.remove(force=True)
    finally:
        client.close()


def minimal_rootfs(dest: Path) -> None:
    """A few host tools and the libraries they load, a /tmp and an os-release: an image with no userland."""
    for tool in TOOLS:
        binary = shutil.which(tool)
        if binary is None:
            skip_missing(f"{tool} is not installed")
        real = os.path.realpath(binary)
        for path in [real, *_libraries(real)]:
            target = dest / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        (dest / "bin").mkdir(exist_ok=True)
        link = dest / "bin" / tool
        if not link.exists():
            link.symlink_to(real)
    (dest / "etc").mkdir(exist_ok=True)
    (dest / "etc" / "os-release").write_text("ID=snapgym-docker-test\n")
    (dest / "tmp").mkdir(mode=0o1777, exist_ok=True)
    os.chmod(dest / "tmp", 0o1777)


def rootfs_tarball(folder: Path) -> Path:
    """:func:`minimal_rootfs` as a tarball (what ``docker export`` gives)."""
    tree = folder / "tree"
    minimal_rootfs(tree)
    tarball = folder / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        for entry in sorted(tree.iterdir()):
            tar.add(entry, arcname=entry.name)
    return tarball


def _libraries(binary: str) -> list[str]:
    if shutil.which("ldd") is None:
        skip_missing("ldd is not installed")
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts else ""
        if path.startswith("/"):
            libs.append(os.path.realpath(path))
            if os.path.realpath(path) != path:
                libs.append(path)
    return libs


class EngineProxy:
    """A unix socket that forwards to the real engine until :meth:`vanish` (an engine that dies);
    ``tcp=True``: a TCP port on loopback instead, the engine as a remote one looks."""

    def __init__(self, folder: Path, target: str = "/var/run/docker.sock", *, tcp: bool = False) -> None:
        self.path = folder / "engine.sock"
        self._tcp = tcp
        self._target = target
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                upstream = socket.socket(socket.AF_UNIX)
                upstream.connect(proxy._target)
                with proxy._lock:
                    proxy._open.update({self.request, upstream})
                pump = threading.Thread(target=_pump, args=(upstream, self.request), daemon=True)
                pump.start()
                _pump(self.request, upstream)
                pump.join()

        self._server: socketserver.ThreadingMixIn
        if tcp:
            self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        else:
            self._server = socketserver.ThreadingUnixStreamServer(str(self.path), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        """The proxy's address for ``DockerBackend(base_url=...)``."""
        if self._tcp:
            host, port = self._server.server_address  # type: ignore[attr-defined]
            return f"tcp://{host}:{port}"
        return f"unix://{self.path}"

    def vanish(self) -> None:
        """Stop answering: the listening socket and every connection close."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        self.path.unlink(missing_ok=True)


def _pump(source: socket.socket, dest: socket.socket) -> None:
    """Forward until either side closes, then close both (as one connection would)."""
    with contextlib.suppress(OSError):
        while chunk := source.recv(1 << 16):
            dest.sendall(chunk)
    for sock in (source, dest):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def backend(**options: Any) -> Iterator[DockerBackend]:
    """A backend with the test limits and prefix (``options`` on top), closed after."""
    with DockerBackend(**{**LIMITS, **options}) as made:
        yield made
