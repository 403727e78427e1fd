"""Read-only layers on disk: stage, commit and verify them; import a root filesystem.

A layer is a directory tree in overlayfs format (whiteouts are 0/0 character
devices, opaque directories carry an ``overlay.opaque`` xattr). Layers are
content-addressed: the directory name is the first 32 hex digits of the tree's
digest, so the same content is stored once, and each has a manifest (see
:mod:`manifest`) that lets the first use in a process check it with one stat
walk. Every walk here is iterative and relative to directory descriptors
(:mod:`walk`), so trees of any depth work and symlinks are never followed.

Read-only: a layer's modes are part of its content, so they cannot be stripped;
and ``chattr +i`` cannot be used either, because overlayfs copies the immutable
flag of a lower inode onto the merged one, which would make every file of the
snapshot unwritable inside the sandbox. A layer is guarded instead by the store
being 0700 and by the check before first use; manifests and records are 0444.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

from pool.backends.local.store import durable, manifest, staging, walk
from pool.backends.local.store.treecopy import copy_tree
from pool.errors import SnapshotCorruptError, SnapshotError

__all__ = ["LayerStore", "copy_tree", "extract_rootfs", "is_empty_dir", "reap_orphans", "remove_tree", "shift_owners"]


class LayerStore:
    """The directory holding every layer of one snapshot store, and their manifests."""

    def __init__(self, root: Path, *, manifests: Path, id_offset: int) -> None:
        self.root = root
        self.manifests = manifests
        self.id_offset = id_offset
        root.mkdir(parents=True, exist_ok=True)
        manifests.mkdir(parents=True, exist_ok=True)
        self._verified: dict[str, str] = {}
        self._paths: dict[str, Path] = {}
        self._lock = threading.Lock()

    def path(self, layer_id: str) -> Path:
        """Where a layer's tree lives."""
        path = self._paths.get(layer_id)
        if path is None:  # asked for every layer of a snapshot at each instance, seal and end-state diff
            path = self._paths[layer_id] = self.root / layer_id
        return path

    def exists(self, layer_id: str) -> bool:
        """True when the layer is present."""
        return self.path(layer_id).is_dir()

    def require(self, layer_id: str) -> Path:
        """The layer's path, or SnapshotError naming the missing layer."""
        path = self.path(layer_id)
        if not path.is_dir():
            raise SnapshotError(
                f"layer {layer_id} is missing from {self.root}; the snapshot store was "
                "changed by hand: build the template again"
            )
        return path

    @contextlib.contextmanager
    def staging(self, what: str) -> Iterator[Path]:
        """A fresh folder to assemble a layer in, removed unless committed.

        Whatever ends the block (an exception, KeyboardInterrupt) removes the folder;
        ENOSPC or EDQUOT of the store becomes StoreFullError. A folder left by a
        killed process is named for its owner, so :meth:`reap` can remove it.
        """
        staged = self.root / staging.new_name()
        try:
            with durable.space_checked(self.root.parent, what):
                staged.mkdir(mode=0o700)
                yield staged
        finally:
            remove_tree(staged)

    def commit(self, staged: Path) -> tuple[str, str]:
        """Move a staged tree into the store under its digest; (layer id, digest).

        The tree is hashed into its manifest, made durable, renamed into place and
        the rename made durable; then the manifest is written.
        """
        with durable.space_checked(self.root.parent, "committing a layer"):
            found = manifest.scan(staged, id_offset=self.id_offset)
            layer_id = found.digest[:32]
            if self.exists(layer_id) or not self._place(staged, layer_id, len(found.entries)):
                # Stored already. A damaged copy is not replaced, since sandboxes may have it
                # mounted: verify refuses it, and its snapshots are rebuilt once it is deleted.
                return layer_id, self.verify(layer_id)
            durable.fsync_dir(self.root)
            durable.write_file(self._manifest_path(layer_id), found.to_json(), sync=False)
        self._verified[layer_id] = found.digest
        return layer_id, found.digest

    def verify(self, layer_id: str, *, deep: bool = False) -> str:
        """The layer's digest, once its content is checked against it (once per process unless ``deep``).

        Raises:
            SnapshotCorruptError: the content differs; names the layer and the first differing path.
        """
        if not deep and layer_id in self._verified:
            return self._verified[layer_id]
        path = self.require(layer_id)
        with self._lock:
            recorded = manifest.load(self._manifest_path(layer_id), layer_id)
            if recorded is None:
                recorded = self._rescan(layer_id, path)
            else:
                refreshed = manifest.check(path, recorded, layer_id=layer_id, id_offset=self.id_offset, deep=deep)
                if refreshed is not None:
                    self._save_manifest(layer_id, refreshed)
            self._verified[layer_id] = recorded.digest
        return recorded.digest

    def reap(self) -> int:
        """Remove staging folders and files whose owner is dead; how many."""
        return reap_orphans(self.root, self.manifests)

    def _place(self, staged: Path, layer_id: str, entries: int) -> bool:
        """Flush the staged tree and rename it to its id; False when that id was stored meanwhile."""
        durable.sync_tree(staged, entries)
        try:
            os.rename(staged, self.path(layer_id))
            return True
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        return False

    def _rescan(self, layer_id: str, path: Path) -> manifest.Manifest:
        found = manifest.scan(path, id_offset=self.id_offset)
        if not found.digest.startswith(layer_id):
            raise SnapshotCorruptError(
                f"layer {layer_id} at {path} does not hold the content its name says, and its manifest is "
                "missing or damaged, so the first changed path is unknown. Delete the layer and build its "
                f"templates again, or delete the whole store ({self.root.parent})",
                layer_id=layer_id,
            )
        self._save_manifest(layer_id, found)
        return found

    def _save_manifest(self, layer_id: str, found: manifest.Manifest) -> None:
        # A manifest only speeds the next check up; a full disk must not fail the check.
        with contextlib.suppress(OSError):
            durable.write_file(self._manifest_path(layer_id), found.to_json(), sync=False)

    def _manifest_path(self, layer_id: str) -> Path:
        return self.manifests / f"{layer_id}.json"


def is_empty_dir(path: Path) -> bool:
    """True when a directory has no entries."""
    with os.scandir(path) as it:
        return next(it, None) is None


def shift_owners(root: Path, offset: int) -> None:
    """Add ``offset`` to every owner under root (for root-mode id mapping)."""
    if offset == 0 or os.geteuid() != 0:
        return
    fd = os.open(root, walk.O_DIR)
    shifted: set[tuple[int, int]] = set()  # an inode with several links is shifted once
    try:
        for node in walk.walk(fd):
            st = node.st
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) in shifted:
                    continue
                shifted.add((st.st_dev, st.st_ino))
            if node.fd >= 0:
                os.chown(node.fd, st.st_uid + offset, st.st_gid + offset)
            else:
                os.chown(node.name, st.st_uid + offset, st.st_gid + offset, dir_fd=node.dir_fd, follow_symlinks=False)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                _chmod(node, stat.S_IMODE(st.st_mode))  # chown cleared set-id bits; restore them
    finally:
        os.close(fd)


def _chmod(node: walk.Node, mode: int) -> None:
    if node.fd >= 0:
        os.fchmod(node.fd, mode)
    else:  # not a symlink, and the staged tree is this process's own
        os.chmod(node.name, mode, dir_fd=node.dir_fd)


def extract_rootfs(source: Path, dest: Path) -> None:
    """Unpack a root filesystem tarball or copy a directory into ``dest``."""
    if source.is_dir():
        copy_tree(source, dest)
        return
    if not hasattr(tarfile, "tar_filter"):
        raise SnapshotError("unpacking a root filesystem safely needs Python 3.11.4 or newer")
    try:
        with tarfile.open(source) as tar:
            tar.extractall(dest, filter=_rootfs_filter, numeric_owner=True)
    except tarfile.TarError as exc:
        raise SnapshotError(f"cannot unpack root filesystem {source}: {exc}") from exc
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise  # the store's space_checked turns this into StoreFullError
        raise SnapshotError(f"cannot unpack root filesystem {source}: {exc}") from exc


def _rootfs_filter(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    # A root filesystem legitimately holds absolute symlinks and device nodes,
    # so the strict "data" filter does not fit; "tar" still refuses members
    # that would land outside the destination.
    if member.isdev() and not (member.ischr() and member.devmajor == 0 and member.devminor == 0):
        return None  # device nodes come from the sandbox's own /dev
    return tarfile.tar_filter(member, path)


def remove_tree(path: Path) -> None:
    """Delete a tree (or a file) without following symlinks, at any depth, even where modes deny writes.

    Entries that vanish meanwhile are fine: two backends starting on one machine may
    reap the same crashed run's folder at once.
    """
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(path)
            return
        fd = _open_for_removal(path)
    except FileNotFoundError:
        return
    try:
        for node in walk.walk(fd, leaving=True, missing_ok=True, force=True):
            with contextlib.suppress(FileNotFoundError):
                _remove_step(node)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)


def reap_orphans(*folders: Path) -> int:
    """Remove the staging entries of dead owners (see :mod:`staging`) in these folders; how many."""
    reaped = 0
    for folder in folders:
        for entry in folder.iterdir():
            if staging.is_orphan(entry):
                remove_tree(entry)
                reaped += 1
    return reaped


def _open_for_removal(path: Path) -> int:
    try:
        return os.open(path, walk.O_DIR)
    except PermissionError:
        os.chmod(path, 0o700)
        return os.open(path, walk.O_DIR)


def _remove_step(node: walk.Node) -> None:
    if node.leaving:
        if node.dir_fd >= 0:
            os.rmdir(node.name, dir_fd=node.dir_fd)
    elif node.fd >= 0:
        if os.geteuid() != 0 and node.st.st_mode & 0o700 != 0o700:
            os.fchmod(node.fd, 0o700)  # so its entries can be unlinked
    else:
        os.unlink(node.name, dir_fd=node.dir_fd)
