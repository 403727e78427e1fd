"""A ``toolchain`` verifier's install delta, as a stored layer over the known-good snapshot.

The agent's writable layer (``upper``) is copied while its processes are stopped, through
:mod:`pool.backends.local.store.treecopy` (never following a link the agent made). The copy's
changes over the known-good layers are listed from the copy itself (overlayfs's own marks, as
:mod:`pool.backends.local.store.changes` reads them), :func:`pool.verification.installs.select` judges the
added paths against the known-good snapshot (read on the host, :class:`LayerView`), and
everything else is removed from the copy: what stays is the grafted files and links and the
folders that hold them, with no overlay marks (a kept folder never hides the snapshot's
content) and the snapshot's modes on folders it has. That tree is stored as a layer; the
verifier's instance gets it as its top read-only layer.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Callable
from pathlib import Path

from pool.backends.local.store import walk
from pool.backends.local.store.catalogue import SnapshotStore
from pool.backends.local.store.changes import read_changes
from pool.backends.local.store.layerview import LayerView
from pool.backends.local.store.treecopy import copy_tree
from pool.build.hostview import HostView
from pool.verification.installs import InstallDelta, select

MIB = 1 << 20
MAX_READ_BYTES = 1 << 20
"""The most of one metadata file (``RECORD``, ``entry_points.txt``) read from the agent's files."""
_OVERLAY_XATTRS = (b"trusted.overlay.", b"user.overlay.")


class KnownGoodFiles:
    """The known-good snapshot, read on the host: its layers, and the host base's read-only binds."""

    def __init__(self, layers: list[Path], host: HostView | None, *, rootless: bool) -> None:
        self._view = LayerView(layers, rootless=rootless)
        self._host = host

    def _on_host(self, path: str) -> str | None:
        if self._host is None:
            return None
        for inside, target in self._host.symlinks:
            if path == inside or path.startswith(inside + "/"):
                path = posixpath.normpath(posixpath.join(posixpath.dirname(inside), target) + path[len(inside) :])
        for host_path, inside in self._host.binds:
            if path == inside or path.startswith(inside + "/"):
                return host_path + path[len(inside) :]
        return None

    def kind(self, path: str) -> str | None:
        """``"dir"``, ``"file"``, ``"link"`` or None (see :class:`pool.verification.installs.KnownGood`)."""
        host = self._on_host(path)
        if host is not None:
            try:
                return _kind(os.lstat(host).st_mode)
            except OSError:
                return None
        entry = self._view.entry(path)
        return None if entry is None else _kind(entry.mode)

    def names(self, path: str) -> frozenset[str]:
        """The names in the folder at ``path``."""
        host = self._on_host(path)
        if host is not None:
            try:
                return frozenset(os.listdir(host))
            except OSError:
                return frozenset()
        return self._view.names(path)

    def folder_mode(self, path: str) -> int | None:
        """The permission bits of the snapshot's folder at ``path`` in its layers (None: no folder there)."""
        entry = self._view.entry(path)
        return None if entry is None or not stat.S_ISDIR(entry.mode) else stat.S_IMODE(entry.mode)


class AgentCopy:
    """The copy of the agent's writable layer, read component by component (no link followed)."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def _at(self, path: str, use: Callable[[int, str], bytes | str | None]) -> bytes | str | None:
        parent, name = posixpath.split(path.strip("/"))
        root = os.open(self._root, walk.O_DIR)
        try:
            fd = walk.open_under(root, os.fsencode(parent))
        except OSError:
            return None
        finally:
            os.close(root)
        try:
            return use(fd, name)
        except OSError:
            return None
        finally:
            os.close(fd)

    def read(self, path: str) -> bytes | None:
        """The first MiB of a regular file; None for anything else."""

        def use(fd: int, name: str) -> bytes | None:
            file = os.open(name, walk.O_FILE, dir_fd=fd)
            try:
                return os.read(file, MAX_READ_BYTES) if stat.S_ISREG(os.fstat(file).st_mode) else None
            finally:
                os.close(file)

        found = self._at(path, use)
        return found if isinstance(found, bytes) else None

    def is_plain(self, path: str) -> bool:
        """A regular file, folder or link (not a FIFO, socket or device node)."""
        found = self._at(path, lambda fd, name: b"y" if _is_plain(os.lstat(name, dir_fd=fd).st_mode) else None)
        return found == b"y"

    def readlink(self, path: str) -> str | None:
        """A link's target; None when it is no link."""
        found = self._at(path, lambda fd, name: os.readlink(name, dir_fd=fd))
        return found if isinstance(found, str) else None


def build(
    store: SnapshotStore,
    upper: Path,
    known_good: list[Path],
    *,
    host: HostView | None,
    path: str,
    rootless: bool,
    max_mb: int,
    pause: Callable[[], None],
    resume: Callable[[], None],
) -> tuple[Path | None, InstallDelta]:
    """The stored layer of the agent's grafted installs (None when nothing is grafted), and the delta.

    Args:
        upper: the agent's writable layer.
        known_good: the trusted snapshot's layers, bottom first.
        path: the known-good ``PATH`` (new commands that shadow one on it are dropped).
        pause: stops the agent's processes before the copy.
        resume: restarts them after it.
    """
    with store.layers.staging("grafting an agent's installs for its verifier") as staged:
        pause()
        try:
            copy_tree(upper, staged, max_bytes=max_mb * MIB)
        finally:
            resume()
        changes = read_changes(staged, known_good, rootless=rootless, max_paths=1 << 30, max_entries=2_000_000)
        kg = KnownGoodFiles(known_good, host, rootless=rootless)
        delta = select(
            changes.added, kg, AgentCopy(staged), changed=changes.changed, path=path, truncated=changes.truncated
        )
        if not delta.grafted:
            return None, delta
        _prune(staged, frozenset(delta.grafted), kg)
        layer_id, _ = store.layers.commit(staged)
    return store.layers.path(layer_id), delta


def _prune(root: Path, keep: frozenset[str], kg: KnownGoodFiles) -> None:
    """Leave in ``root`` only ``keep`` and the folders that hold them, without overlay marks."""
    folders = {parent for path in keep for parent in _parents(path)}
    for at, dirs, files in os.walk(root, topdown=False):  # never descends through a link
        rel = "/" + os.path.relpath(at, root) if at != str(root) else ""
        for name in (*files, *dirs):
            full = os.path.join(at, name)
            inside = f"{rel}/{name}"
            is_dir = stat.S_ISDIR(os.lstat(full).st_mode)
            if is_dir and inside in folders:
                _unmark(full)
                if (mode := kg.folder_mode(inside)) is not None:
                    os.chmod(full, mode)
            elif not is_dir and inside in keep:
                _unmark(full)
            elif is_dir:
                os.rmdir(full)  # its content went first
            else:
                os.unlink(full)
    _unmark(str(root))


def _parents(path: str) -> list[str]:
    found = []
    while (path := posixpath.dirname(path)) != "/":
        found.append(path)
    return found


def _unmark(path: str) -> None:
    """Remove overlayfs's marks (opaque, redirect, metacopy) so the layer only adds."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return
    for name in names:
        if os.fsencode(name).startswith(_OVERLAY_XATTRS):
            os.removexattr(path, name, follow_symlinks=False)


def _is_plain(mode: int) -> bool:
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)


def _kind(mode: int) -> str:
    return "dir" if stat.S_ISDIR(mode) else "link" if stat.S_ISLNK(mode) else "file"
