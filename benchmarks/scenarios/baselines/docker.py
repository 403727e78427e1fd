"""The Docker reset: throw the container away and start a new one from the image.

The image is imported from a local tarball (``benchmarks.scenarios.measure.rootfs``). Each timed
iteration force-removes the previous container (which was dirtied the same
way as the sandbox, outside the clock), then creates and starts a new one
running ``/bin/sleep 1000`` as PID 1, with ``network_mode="none"`` as sandbox
episodes have no network. The clock stops when the engine answers the start
call, i.e. the new container's process is running and stays up.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from benchmarks.reports.report import Skipped
from benchmarks.scenarios.measure.timing import measure

_COMMAND = ["/bin/sleep", "1000"]


def connect() -> Any | Skipped:
    """A ``docker.DockerClient`` talking to a live engine, or why there is none."""
    try:
        import docker
    except ImportError:
        return Skipped("the docker SDK is not installed (pip install 'snapgym[docker]')")
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except docker.errors.DockerException as exc:
        return Skipped(f"no Docker engine reachable ({_first_line(exc)}); start dockerd or set DOCKER_HOST")
    return client


def engine_version(client: Any) -> str:
    """The engine's version string."""
    return str(client.version().get("Version", "unknown"))


def recreate_latency(
    client: Any, tarball: Path, *, repository: str, dirty_command: str, repetitions: int, warmup: int
) -> list[float]:
    """Time force-remove + create + start of a container, per iteration.

    The image is imported before and removed after the measurement.

    Returns:
        Milliseconds per timed iteration.
    """
    tag = secrets.token_hex(6)
    client.api.import_image_from_file(str(tarball), repository=repository, tag=tag)
    image = f"{repository}:{tag}"
    try:
        return _Recreator(client, image).run(dirty_command, repetitions=repetitions, warmup=warmup)
    finally:
        client.images.remove(image, force=True)


class _Recreator:
    """Holds the one live container between iterations."""

    def __init__(self, client: Any, image: str) -> None:
        self._client = client
        self._image = image
        self._current: Any = None

    def run(self, dirty_command: str, *, repetitions: int, warmup: int) -> list[float]:
        self._current = self._start()
        try:
            return measure(
                self._recreate,
                repetitions=repetitions,
                warmup=warmup,
                before=lambda: self._dirty(dirty_command),
                after=self._keep,
            )
        finally:
            if self._current is not None:
                self._current.remove(force=True)

    def _start(self) -> Any:
        return self._client.containers.run(self._image, _COMMAND, detach=True, network_mode="none")

    def _recreate(self) -> Any:
        self._current.remove(force=True)
        self._current = None
        return self._start()

    def _keep(self, container: Any) -> None:
        self._current = container

    def _dirty(self, command: str) -> None:
        code, output = self._current.exec_run(["/bin/sh", "-c", command])
        if code != 0:
            raise RuntimeError(f"dirtying the container failed ({code}): {output!r}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
