"""Read-only layers on disk: freeze a writable layer, import a root filesystem.

A layer is a directory tree in overlayfs format (whiteouts are 0/0 character
devices, opaque directories carry an ``overlay.opaque`` xattr). Layers are
content-addressed: the directory name is derived from the tree's digest, so the
same content is stored once.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path

from pool.digest import CONTENT_XATTRS, tree_digest
from pool.errors import SnapshotError


class LayerStore:
    """The directory holding every layer of one snapshot store."""

    def __init__(self, root: Path, *, id_offset: int) -> None:
        self.root = root
        self.id_offset = id_offset
        root.mkdir(parents=True, exist_ok=True)

    def path(self, layer_id: str) -> Path:
        """Where a layer's tree lives."""
        return self.root / layer_id

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

    def staging_dir(self) -> Path:
        """A fresh directory to assemble a layer in, on the store's filesystem."""
        return Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))

    def commit(self, staged: Path) -> tuple[str, str]:
        """Move a staged tree into the store under its digest; (layer id, digest)."""
        digest = tree_digest(staged, id_offset=self.id_offset)
        layer_id = digest[:32]
        target = self.path(layer_id)
        try:
            os.rename(staged, target)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            remove_tree(staged)  # the same content is already stored
        return layer_id, digest

    def layer_digest(self, layer_id: str) -> str:
        """Recompute a stored layer's digest (used to verify it)."""
        return tree_digest(self.require(layer_id), id_offset=self.id_offset)


def is_empty_dir(path: Path) -> bool:
    """True when a directory has no entries."""
    with os.scandir(path) as it:
        return next(it, None) is None


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a layer tree exactly: types, modes, owners, times, overlay xattrs.

    Symlinks are copied as links and never followed, so a tree written by
    untrusted code cannot make the host read or write outside it.
    """
    dirs: list[tuple[str, os.stat_result]] = []
    _copy_entry(os.fspath(src), os.fspath(dst), dirs, is_root=True)
    # Directory modes and times last: children are written first.
    for path, st in reversed(dirs):
        os.chmod(path, stat.S_IMODE(st.st_mode))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _copy_entry(src: str, dst: str, dirs: list[tuple[str, os.stat_result]], *, is_root: bool = False) -> None:
    st = os.lstat(src)
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        if not is_root:
            os.mkdir(dst, 0o700)
        for name in os.listdir(src):
            _copy_entry(os.path.join(src, name), os.path.join(dst, name), dirs)
        dirs.append((dst, st))
    elif stat.S_ISREG(mode):
        _copy_file(src, dst)
    elif stat.S_ISLNK(mode):
        os.symlink(os.readlink(src), dst)
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
        os.mknod(dst, mode, st.st_rdev)
    else:
        return  # sockets are not state worth keeping
    _copy_meta(src, dst, st)


def _copy_file(src: str, dst: str) -> None:
    sfd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(sfd).st_size
            copied = 0
            while copied < size:
                n = os.sendfile(dfd, sfd, copied, size - copied)
                if n == 0:
                    break
                copied += n
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _copy_meta(src: str, dst: str, st: os.stat_result) -> None:
    is_link = stat.S_ISLNK(st.st_mode)
    if os.geteuid() == 0:
        os.lchown(dst, st.st_uid, st.st_gid)
    try:
        for name in os.listxattr(src, follow_symlinks=False):
            if name in CONTENT_XATTRS:
                os.setxattr(dst, name, os.getxattr(src, name, follow_symlinks=False), follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.ENOTSUP, errno.EPERM):
            raise
    if not is_link:
        if not stat.S_ISDIR(st.st_mode):
            os.chmod(dst, stat.S_IMODE(st.st_mode))
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    else:
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def shift_owners(root: Path, offset: int) -> None:
    """Add ``offset`` to every owner under root (for root-mode id mapping)."""
    if offset == 0 or os.geteuid() != 0:
        return
    entries = [os.fspath(root)]
    for dirpath, dirnames, filenames in os.walk(root):
        entries += (os.path.join(dirpath, n) for n in dirnames + filenames)
    for name in entries:
        st = os.lstat(name)
        mode = st.st_mode
        os.lchown(name, st.st_uid + offset, st.st_gid + offset)
        if not stat.S_ISLNK(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
            os.chmod(name, stat.S_IMODE(mode))  # chown cleared set-id bits; restore them


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
    except (tarfile.TarError, OSError) as exc:
        raise SnapshotError(f"cannot unpack root filesystem {source}: {exc}") from exc


def _rootfs_filter(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    # A root filesystem legitimately holds absolute symlinks and device nodes,
    # so the strict "data" filter does not fit; "tar" still refuses members
    # that would land outside the destination.
    if member.isdev() and not (member.ischr() and member.devmajor == 0 and member.devminor == 0):
        return None  # device nodes come from the sandbox's own /dev
    return tarfile.tar_filter(member, path)


def remove_tree(path: Path) -> None:
    """Delete a tree without following symlinks, even where modes deny writes.

    Entries that vanish meanwhile are fine: two backends starting on one machine may
    reap the same crashed run's folder at once.
    """

    def _make_writable(func: object, p: str, exc_info: tuple[type[BaseException], BaseException, object]) -> None:
        if isinstance(exc_info[1], FileNotFoundError):
            return  # already gone: another process (a second backend reaping the same orphan) removed it
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
                shutil.rmtree(p, onerror=_make_writable)
            elif os.path.lexists(p):
                os.unlink(p)
        except FileNotFoundError:
            pass

    if path.exists() or path.is_symlink():
        shutil.rmtree(path, onerror=_make_writable)
