"""Durable writes to the snapshot store.

A record is written to a staging file, fsync-ed, made read-only (0444) and
renamed over its final name, and the directory is fsync-ed, so a crash leaves
the old version or the new one, never a torn file. (A manifest is written the
same way without the fsyncs: it only makes checks cheaper, and a lost or torn
one means a full rehash.) A layer tree is made durable before it is renamed
into place, so the rename only counts once the data it names is on disk: with
an fsync per entry when it is small, and one ``syncfs`` of the store's
filesystem when it has more than ``_FSYNC_EACH_MAX`` entries (on 1,000 files
that is about four times cheaper, but it also waits for whatever else is dirty
on that filesystem, which a small mid-episode snapshot should not).

A full filesystem (ENOSPC, EDQUOT) while writing becomes StoreFullError.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from pool.backends.local.store import staging, walk
from pool.errors import StoreFullError

RECORD_MODE = 0o444
_FULL = (errno.ENOSPC, errno.EDQUOT)
_FSYNC_EACH_MAX = 64
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_libc = ctypes.CDLL(None, use_errno=True)


def write_file(path: Path, data: bytes, *, mode: int = RECORD_MODE, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically (and durably unless ``sync`` is False), leaving it ``mode``."""
    tmp = path.with_name(staging.new_name(".part"))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if sync:
        fsync_dir(path.parent)


def sync_tree(root: Path, entries: int) -> None:
    """Make a tree of ``entries`` entries durable: an fsync each when few, else one syncfs."""
    if entries > _FSYNC_EACH_MAX:
        sync_filesystem(root)
        return
    with _closing(os.open(root, walk.O_DIR)) as fd:
        for node in walk.walk(fd):
            if node.fd >= 0:
                os.fsync(node.fd)  # a directory: its entries, symlinks and device nodes included
            elif stat.S_ISREG(node.st.st_mode):
                with _closing(walk.open_file(node)) as file_fd:
                    os.fsync(file_fd)


def fsync_dir(path: Path) -> None:
    """Make the entries of a directory (creations, renames) durable."""
    with _closing(os.open(path, _DIR)) as fd:
        os.fsync(fd)


def sync_filesystem(path: Path) -> None:
    """Flush everything written to the filesystem holding ``path`` (syncfs)."""
    with _closing(os.open(path, _DIR)) as fd:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs of {path}: {os.strerror(err)}")


@contextlib.contextmanager
def _closing(fd: int) -> Iterator[int]:
    """The descriptor ``fd``, closed when the block ends (``contextlib.closing`` for descriptors)."""
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def space_checked(store: Path, what: str) -> Iterator[None]:
    """Turn ENOSPC/EDQUOT raised inside into StoreFullError naming the store and the write."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _FULL:
            raise
        raise StoreFullError(
            f"the snapshot store {store} ran out of space while {what} ({os.strerror(exc.errno)}); "
            "nothing was kept: free space on its filesystem, or pass LocalBackend(store_dir=...) "
            "on a larger one"
        ) from exc
