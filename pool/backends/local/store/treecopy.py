"""Copy a layer tree exactly: types, modes, owners, times, overlay xattrs, holes, hard links.

The source may have been written by untrusted code (a sandbox's writable layer),
so it is read through :mod:`walk`: relative to directory descriptors, never
following a symlink, at any depth. Regular files are copied extent by extent
(``SEEK_DATA``/``SEEK_HOLE``) and then truncated to their size, so holes stay
holes; the second and later paths of a hard-link group become links to the
first copy. An optional limit on allocated bytes (``st_blocks``, so sparse
files count what they hold) stops the copy before it writes past it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from pool.backends.local.store import walk
from pool.build.digest import CONTENT_XATTRS, data_extents
from pool.errors import SnapshotTooLargeError

_MIB = 1 << 20


def copy_tree(src: Path, dst: Path, *, max_bytes: int | None = None) -> int:
    """Copy the tree under ``src`` into the existing directory ``dst``; the bytes it allocates.

    Sockets are skipped: they are not state worth keeping.

    Raises:
        SnapshotTooLargeError: the tree allocates more than ``max_bytes``.
    """
    src_fd = os.open(src, walk.O_DIR)
    try:
        out = _Writer(os.open(dst, walk.O_DIR), src, max_bytes)
        try:
            for node in walk.walk(src_fd, leaving=True):
                out.visit(node)
        finally:
            out.close()
    finally:
        os.close(src_fd)
    return out.allocated


class _Writer:
    """The destination side of a copy, following the walk of the source."""

    def __init__(self, root_fd: int, src: Path, max_bytes: int | None) -> None:
        self.root_fd = root_fd
        self.dirs = walk.FdStack()  # the destination directory at each depth of the walk
        self.dirs.push(os.dup(root_fd), os.fstat(root_fd))
        self.links: dict[tuple[int, int], bytes] = {}  # (dev, ino) of a source file -> its first path
        self.allocated = 0
        self.src = src
        self.max_bytes = max_bytes
        self.is_root = os.geteuid() == 0

    def visit(self, node: walk.Node) -> None:
        if node.dir_fd < 0:  # the root: the destination exists already
            if node.leaving:
                _set_times_and_mode(self.root_fd, None, node.st)
            else:
                self._meta_fd(self.root_fd, node, node.fd)
            return
        if node.leaving:
            self.dirs.pop()
            _set_times_and_mode(self.dirs.top(), node.name, node.st)
            return
        if not self._linked(node):
            self._count(node)
        self._copy(node)

    def close(self) -> None:
        self.dirs.close()
        os.close(self.root_fd)

    def _count(self, node: walk.Node) -> None:
        self.allocated += node.st.st_blocks * 512
        if self.max_bytes is not None and self.allocated > self.max_bytes:
            raise SnapshotTooLargeError(
                f"the tree at {self.src} allocates more than {self.max_bytes / _MIB:g} MiB "
                f"(the limit was reached at {'/' + os.fsdecode(node.path())!r})"
            )

    def _copy(self, node: walk.Node) -> None:
        parent, name, mode = self.dirs.top(), node.name, node.st.st_mode
        if stat.S_ISDIR(mode):
            os.mkdir(name, 0o700, dir_fd=parent)
            fd = os.open(name, walk.O_DIR, dir_fd=parent)
            self.dirs.push(fd, os.fstat(fd))
            self._meta_fd(fd, node, node.fd)
        elif stat.S_ISREG(mode):
            self._copy_file(node, parent)
        elif stat.S_ISLNK(mode):
            os.symlink(os.readlink(name, dir_fd=node.dir_fd), name, dir_fd=parent)
            self._chown(name, parent, node.st)
            os.utime(name, ns=(node.st.st_atime_ns, node.st.st_mtime_ns), dir_fd=parent, follow_symlinks=False)
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
            os.mknod(name, mode, node.st.st_rdev, dir_fd=parent)
            self._chown(name, parent, node.st)
            _copy_xattrs(node.proc_path(), f"/proc/self/fd/{parent}/{name}")
            _set_times_and_mode(parent, name, node.st)

    def _linked(self, node: walk.Node) -> bool:
        """True when the entry is a further path of a hard-link group already copied."""
        return stat.S_ISREG(node.st.st_mode) and node.st.st_nlink > 1 and (node.st.st_dev, node.st.st_ino) in self.links

    def _copy_file(self, node: walk.Node, parent: int) -> None:
        key = (node.st.st_dev, node.st.st_ino)
        if node.st.st_nlink > 1:
            if key in self.links:
                self._link(self.links[key], node.name, parent)
                return
            self.links[key] = node.path()
        sfd = walk.open_file(node)
        try:
            dfd = os.open(node.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=parent)
            try:
                _copy_data(sfd, dfd, node.st.st_size)
                self._meta_fd(dfd, node, sfd)
                os.fchmod(dfd, stat.S_IMODE(node.st.st_mode))
                os.utime(dfd, ns=(node.st.st_atime_ns, node.st.st_mtime_ns))
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)

    def _link(self, first: bytes, name: str, parent: int) -> None:
        head, _, leaf = first.rpartition(b"/")
        holder = walk.open_under(self.root_fd, head)
        try:
            os.link(leaf, name, src_dir_fd=holder, dst_dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(holder)

    def _meta_fd(self, dfd: int, node: walk.Node, sfd: int) -> None:
        if self.is_root:
            os.fchown(dfd, node.st.st_uid, node.st.st_gid)
        _copy_xattrs(sfd, dfd)

    def _chown(self, name: str, parent: int, st: os.stat_result) -> None:
        if self.is_root:
            os.chown(name, st.st_uid, st.st_gid, dir_fd=parent, follow_symlinks=False)


def _copy_data(sfd: int, dfd: int, size: int) -> None:
    for start, end in data_extents(sfd, size):
        offset = start
        os.lseek(dfd, start, os.SEEK_SET)
        while offset < end:
            sent = os.sendfile(dfd, sfd, offset, end - offset)
            if sent == 0:
                break  # the file shrank under us
            offset += sent
    os.ftruncate(dfd, size)


def _copy_xattrs(src: int | str, dst: int | str) -> None:
    follow = {} if isinstance(src, int) else {"follow_symlinks": False}
    try:
        names = [n for n in os.listxattr(src, **follow) if n in CONTENT_XATTRS]
        for name in names:
            value = os.getxattr(src, name, **follow)
            if isinstance(dst, int):
                os.setxattr(dst, name, value)
            else:
                os.setxattr(dst, name, value, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.ENOTSUP, errno.EPERM):
            raise


def _set_times_and_mode(parent: int, name: str | None, st: os.stat_result) -> None:
    """Mode and times of a directory or node, set last (a directory's after its children)."""
    times = (st.st_atime_ns, st.st_mtime_ns)
    if name is None:
        os.fchmod(parent, stat.S_IMODE(st.st_mode))
        os.utime(parent, ns=times)
        return
    # The destination is this process's own tree, so following the name is safe.
    os.chmod(name, stat.S_IMODE(st.st_mode), dir_fd=parent)
    os.utime(name, ns=times, dir_fd=parent, follow_symlinks=False)
