"""Containers: how every sandbox, spare, build and verifier container is made, and unmade.

Every container runs the helper as PID 1 (``/.snapgym/helper init``; as a
namespace's init nothing inside can kill it) from a read-only volume, as root
of the container, which is not host root when the engine remaps user
namespaces (``dockerd --userns-remap``; ``Capabilities.isolation`` says
"user" then). It gets no network but loopback (``network_mode=none``; a
build step of a template with ``network=True`` gets the engine's default
bridge), its memory, CPU and PID limits as cgroup limits, no new privileges,
and Docker's default capabilities minus NET_RAW, MKNOD and AUDIT_WRITE.
Nothing of the host is mounted but the helper and, for the host base, the
host view's folders, read-only: never the Docker socket, never a home folder
(the Python prefix is bound at its own path even when it lies under one).

Removing is slow (the engine deletes the writable layer), so it happens on a
background thread; killing is fast and done first, so nothing of a finished
episode runs on.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pool.backends.docker.images.catalog import env_list
from pool.backends.docker.transport import helper
from pool.backends.docker.transport.diskquota import DiskQuota
from pool.backends.docker.transport.engine import engine_errors
from pool.capabilities import Enforcement
from pool.errors import ConfigError, SnapgymError, SnapshotNotFoundError

CAP_DROP = ("NET_RAW", "MKNOD", "AUDIT_WRITE")
_MIB = 1 << 20
_PROBE_MB = 8
"""The disk limit of the container that checks a way of limiting disks holds."""
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Limits:
    """What one container may use (None: unlimited)."""

    memory_mb: int | None
    cpus: float | None
    pids: int | None
    disk_mb: int | None


@dataclass(frozen=True, slots=True)
class Spec:
    """Everything a container is made from."""

    image_id: str
    env: Mapping[str, str]
    labels: Mapping[str, str]
    limits: Limits
    host_binds: tuple[tuple[str, str], ...] = ()
    """(host path, container path) pairs mounted read-only: the host view, for the host base."""
    network: bool = False
    """The engine's default bridge instead of loopback only (template builds that ask for it)."""
    what: str = "a sandbox"
    """For error messages."""


class Containers:
    """Makes, kills and removes containers; a few background threads do the slow parts."""

    def __init__(self, client: Any, *, helper_volume: str, workers: int = 8) -> None:
        self._api = client.api
        self._volume = helper_volume
        self.disk = DiskQuota(Enforcement.NONE, why_not="not chosen yet")
        """How containers with a disk limit get it (chosen when the backend starts; see diskquota.choose)."""
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="snapgym-docker")
        self._lock = threading.Lock()
        self._pending: set[concurrent.futures.Future[Any]] = set()

    def start(self, spec: Spec) -> str:
        """Create and start a container; its id. Its disk limit (if any) is held the way
        :attr:`disk` says; its own standard output is logged nowhere (PID 1's output would
        otherwise grow a log file on the host that nothing limits).

        Raises:
            SnapshotNotFoundError: the image is gone from the engine.
            ConfigError: the engine refuses a limit (a disk limit it cannot enforce, say).
            BackendError, HostBrokenError: the engine failed.
        """
        return self._start(spec, self.disk)

    def _start(self, spec: Spec, disk: DiskQuota) -> str:
        api = self._api

        def gone(why: str) -> SnapgymError:
            return SnapshotNotFoundError(
                f"the image {spec.image_id} of the snapshot is gone from the Docker engine ({why}); build the "
                "template again (a checkpoint is gone for good)"
            )

        binds = {self._volume: {"bind": helper.MOUNT, "mode": "ro"}}
        binds.update({host: {"bind": inside, "mode": "ro"} for host, inside in spec.host_binds})
        limits = spec.limits
        with engine_errors(f"creating {spec.what}", missing=gone):
            try:
                host_config = api.create_host_config(
                    binds=binds,
                    network_mode="bridge" if spec.network else "none",
                    mem_limit=f"{limits.memory_mb}m" if limits.memory_mb else None,
                    memswap_limit=f"{limits.memory_mb}m" if limits.memory_mb else None,
                    nano_cpus=int(limits.cpus * 1e9) if limits.cpus else None,
                    pids_limit=limits.pids,
                    storage_opt=disk.storage_opt(limits.disk_mb),
                    cap_drop=list(CAP_DROP),
                    security_opt=["no-new-privileges"],
                    init=False,
                    log_config={"type": "none", "config": {}},
                )
                container = api.create_container(
                    spec.image_id,
                    entrypoint=[helper.PATH, "init"],
                    command=[],
                    environment=env_list(spec.env),
                    working_dir="/",
                    hostname="sandbox",
                    user="0:0",
                    labels=dict(spec.labels),
                    host_config=host_config,
                )["Id"]
            except Exception as exc:
                _refuse_limits(exc, limits)
                raise
        try:
            disk.prepare(api, container, limits.disk_mb)
            with engine_errors(f"starting {spec.what}", missing=gone):
                api.start(container)
        except BaseException:
            self.remove_later(container)
            raise
        return str(container)

    def probe_disk(self, image: str, disk: DiskQuota, labels: Mapping[str, str]) -> bool:
        """Whether ``disk`` limits a container of ``image`` here: the engine takes it, and (for a
        tmpfs layer) the container's root filesystem, seen from this host, has the limit's size."""
        spec = Spec(
            image_id=image,
            env={},
            labels=labels,
            limits=Limits(memory_mb=None, cpus=None, pids=None, disk_mb=_PROBE_MB),
            what="a container that checks the disk limit",
        )
        try:
            container = self._start(spec, disk)
        except (ConfigError, SnapgymError):
            return False
        try:
            if disk.enforcement is Enforcement.QUOTA:
                return True
            pid = int((self._api.inspect_container(container).get("State") or {}).get("Pid") or 0)
            if pid <= 0:
                return False
            root = os.statvfs(f"/proc/{pid}/root")
            return 0 < root.f_blocks * root.f_frsize <= _PROBE_MB * _MIB
        except OSError:
            return False
        finally:
            self.remove_now(container)

    def widen_disk(self, container: str) -> None:
        """Twice the room on a container's disk, for strict verification (see DiskQuota.widen)."""
        with engine_errors("widening a container's disk"):
            self.disk.widen(self._api, container)

    def kill(self, container: str) -> None:
        """Kill every process of a container now (its init, and with it its PID namespace)."""
        with contextlib.suppress(Exception):
            self._api.kill(container)

    def remove_later(self, container: str) -> None:
        """Kill a container now and remove it on a background thread."""
        self.kill(container)
        self.later(self._remove, container)

    def remove_now(self, container: str) -> None:
        """Remove a container (killing it first); a gone one is fine."""
        self._remove(container)

    def later(self, work: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """Run ``work(*args)`` on a background thread."""
        future = self._pool.submit(work, *args)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)
        return future

    def drain(self) -> None:
        """Wait for the background work."""
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                return
            concurrent.futures.wait(pending)

    def close(self) -> None:
        """Finish the background work and stop its threads."""
        self.drain()
        self._pool.shutdown(wait=True)

    def _done(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._pending.discard(future)

    def _remove(self, container: str) -> None:
        with contextlib.suppress(Exception):
            self._api.remove_container(container, force=True, v=False)


def _refuse_limits(exc: BaseException, limits: Limits) -> None:
    text = str(getattr(exc, "explanation", None) or exc)
    if "storage-opt" in text or "storage opt" in text.lower():
        raise ConfigError(
            f"the Docker engine cannot limit a sandbox's disk to {limits.disk_mb} MiB ({text}); use overlay2 "
            "on xfs mounted with pquota, or set disk_limit_mb=None"
        ) from None
    if "memory" in text.lower() and "minimum" in text.lower():
        raise ConfigError(f"the Docker engine refuses the memory limit {limits.memory_mb} MiB: {text}") from None
