"""A sandbox container's disk: how the Docker backend keeps an agent from filling the host.

A container writes into its writable layer, which the engine keeps under its data root, on the
host's disk. Unlimited, one agent that writes in a loop fills the disk that the engine, the
runner's ledger and every other run share. The backend therefore gives each sandbox container
a writable layer of a fixed size and number of files, chosen once when it starts (:func:`choose`):

``quota`` (the engine's own)
    The storage driver takes ``--storage-opt size=`` (overlay2 on xfs mounted with ``pquota``,
    btrfs, zfs): the engine sets a project quota on the layer.
``tmpfs``
    The stock overlay2 on ext4, with the engine on this machine and snapgym as root: between
    create and start, the container's layer folder (``diff/``, ``work/``, ``link``, ``lower``) is
    copied onto a tmpfs of the limit's size and inode count, mounted over the folder. The engine
    then mounts the container's root with its upper layer on that tmpfs: a full disk is
    ``ENOSPC`` (or, out of inodes, the same) inside the container, ``df /`` shows the limit,
    ``docker diff`` and ``docker commit`` read the layer as before, and removing the container
    unmounts it (the engine unmounts whatever lies under a layer it deletes). Pages of a tmpfs
    are charged to the memory cgroup of the process that writes them, so a sandbox's files count
    against its memory limit too, as on the local backend.
``none``
    Neither is possible (a remote engine, another storage driver, not root): the backend refuses
    a disk limit by name, saying what would make one possible, unless it was asked for none.

Build containers (a template's RUN steps, the task author's code) get no disk limit, like
``docker build``; sandbox and verifier containers always get one.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pool.capabilities import Enforcement
from pool.errors import BackendError, ConfigError

INODES_PER_MIB = 256
"""Files a sandbox may hold per MiB of its disk limit (one per 4 KiB: 262,144 in 1 GiB)."""
_MS_REMOUNT = 32
_MS_BIND = 4096
_MNT_DETACH = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_chosen: dict[tuple[str, bool], DiskQuota] = {}
"""The way found for each (engine ID, local) in this process: probing starts a container."""


@dataclass(frozen=True, slots=True)
class DiskQuota:
    """How this backend's sandbox containers get their disk limit."""

    enforcement: Enforcement
    """QUOTA (the engine's ``storage_opt``), TMPFS (a tmpfs under the layer) or NONE."""
    why_not: str = ""
    """For NONE: why neither way works here, and what would make one work."""

    def storage_opt(self, disk_mb: int | None) -> dict[str, str] | None:
        """The ``storage_opt`` of a container with ``disk_mb`` (None: none)."""
        if disk_mb and self.enforcement is Enforcement.QUOTA:
            return {"size": f"{disk_mb}M"}
        return None

    def prepare(self, api: Any, container: str, disk_mb: int | None) -> None:
        """Between create and start: put a created container's layer on its own tmpfs (TMPFS only).

        Raises:
            BackendError: the layer folder could not be found or mounted.
        """
        if disk_mb and self.enforcement is Enforcement.TMPFS:
            mount_layer_on_tmpfs(layer_folder(api, container), size_mb=disk_mb)

    def widen(self, api: Any, container: str) -> None:
        """Give a container's tmpfs layer twice its room (TMPFS only; an engine quota stays).

        For two containers of strict verification: the agent's, once it is killed, because the
        engine mounts a stopped container's layers again to read its outputs and that mount needs
        a free inode (an agent that used every one would otherwise make its outputs unreadable,
        an infrastructure error); and the verifier's, which receives the agent's outputs on top
        of its own files and still has its tests to run.

        Raises:
            BackendError: the layer could not be found or remounted.
        """
        if self.enforcement is Enforcement.TMPFS:
            widen_tmpfs(layer_folder(api, container))


def choose(api: Any, *, local_engine: bool, probe: Callable[[DiskQuota], bool]) -> DiskQuota:
    """The first way that works on this engine (see the module docstring).

    ``probe`` starts a throwaway container with a small limit the given way and says whether the
    limit holds inside it (its root filesystem's size), so a way the engine accepts but does not
    honour (a mount it cannot see) is not taken.
    """
    info = api.info()
    key = (str(info.get("ID") or ""), local_engine)
    if key[0] and key in _chosen:
        return _chosen[key]
    chosen = _choose(info, local_engine=local_engine, probe=probe)
    if chosen.enforcement.is_enforced:  # a failed probe may have been the engine's passing trouble
        _chosen[key] = chosen
    return chosen


def _choose(info: dict[str, Any], *, local_engine: bool, probe: Callable[[DiskQuota], bool]) -> DiskQuota:
    driver = str(info.get("Driver") or "")
    quota = DiskQuota(Enforcement.QUOTA)
    if _accepts_storage_opt(info) and probe(quota):
        return quota
    reasons = []
    if driver != "overlay2":
        reasons.append(f"the storage driver is {driver or 'unknown'}, not overlay2")
    if not local_engine:
        reasons.append("the engine is not on this machine (a unix socket)")
    if os.geteuid() != 0:
        reasons.append("snapgym does not run as root")
    if not reasons:
        tmpfs = DiskQuota(Enforcement.TMPFS)
        if probe(tmpfs):
            return tmpfs
        reasons.append("a tmpfs under a container's layer did not hold (the engine runs in another mount namespace?)")
    return DiskQuota(
        Enforcement.NONE,
        why_not="; ".join(reasons)
        + ". The engine's own quota needs overlay2 on xfs mounted with pquota (or btrfs, zfs); the tmpfs "
        "layer needs overlay2, an engine on this machine and root",
    )


def refuse_unlimited(quota: DiskQuota, disk_mb: int) -> ConfigError:
    """The error for a disk limit no way can enforce here."""
    return ConfigError(
        f"the Docker backend cannot limit a sandbox's disk to {disk_mb} MiB on this engine: {quota.why_not}. "
        "Without a limit an agent can fill the host's disk; to accept that, set backend.disk_limit_mb=null"
    )


def _accepts_storage_opt(info: dict[str, Any]) -> bool:
    """Whether the engine's storage driver may take a size (overlay2 only on xfs with pquota)."""
    driver = str(info.get("Driver") or "")
    status = {str(key): str(value) for key, value in info.get("DriverStatus") or []}
    if driver == "overlay2":
        return status.get("Backing Filesystem", "").lower() == "xfs"
    return driver in ("btrfs", "zfs", "devicemapper", "windowsfilter")


def layer_folder(api: Any, container: str) -> Path:
    """The folder of a created container's writable overlay2 layer (the parent of its upper dir).

    Raises:
        BackendError: the engine does not say where it is, or it is not on this machine.
    """
    data = (api.inspect_container(container).get("GraphDriver") or {}).get("Data") or {}
    upper = data.get("UpperDir")
    folder = Path(upper).parent if upper else None
    if folder is None or not (folder / "diff").is_dir():
        raise BackendError(
            f"the Docker engine does not show container {container[:12]}'s writable layer on this machine "
            f"(UpperDir={upper!r}); its disk cannot be limited"
        )
    return folder


def mount_layer_on_tmpfs(folder: Path, *, size_mb: int) -> None:
    """Mount a tmpfs of ``size_mb`` MiB over ``folder`` holding a copy of what the folder holds
    (owners, modes, extended attributes kept). Nothing is half done: on failure the folder is as
    it was.

    Raises:
        BackendError: the tmpfs could not be mounted or filled.
    """
    info = folder.stat()
    options = (
        f"size={size_mb}m,nr_inodes={size_mb * INODES_PER_MIB},mode={info.st_mode & 0o7777:o},"
        f"uid={info.st_uid},gid={info.st_gid}"
    )
    staging = Path(tempfile.mkdtemp(prefix="snapgym-layer-"))
    try:
        _mount("tmpfs", staging, "tmpfs", 0, options)
        try:
            copied = subprocess.run(
                ["cp", "-a", "--", f"{folder}/.", f"{staging}/"], capture_output=True, text=True, check=False
            )
            if copied.returncode != 0:
                raise BackendError(f"copying the layer {folder} onto its tmpfs failed: {copied.stderr.strip()}")
            _mount(str(staging), folder, "", _MS_BIND, None)
        finally:
            _libc.umount2(str(staging).encode(), _MNT_DETACH)
    finally:
        with contextlib.suppress(OSError):
            staging.rmdir()


def widen_tmpfs(folder: Path) -> None:
    """Remount the tmpfs at ``folder`` with twice its size and inodes (what it holds stays).

    Raises:
        BackendError: the remount failed.
    """
    room = os.statvfs(folder)
    size_bytes, inodes = room.f_blocks * room.f_frsize, room.f_files
    _mount("tmpfs", folder, "tmpfs", _MS_REMOUNT, f"size={2 * size_bytes},nr_inodes={2 * inodes}")


def _mount(source: str, target: Path, fstype: str, flags: int, data: str | None) -> None:
    result = _libc.mount(
        source.encode(), str(target).encode(), fstype.encode(), ctypes.c_ulong(flags), data.encode() if data else None
    )
    if result != 0:
        err = ctypes.get_errno()
        raise BackendError(f"mounting {fstype or 'a bind of ' + source} on {target} failed: {os.strerror(err)}")
