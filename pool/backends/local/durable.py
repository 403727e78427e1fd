"""Durable writes to the snapshot store.

A record or manifest is written to a staging file, fsync-ed, made read-only
(0444) and renamed over its final name, and the directory is fsync-ed, so a
crash leaves the old version or the new one, never a torn file. A layer tree is
flushed with one ``syncfs`` of the store's filesystem before it is renamed into
place: on a tree of 1,000 files that is about four times cheaper than an fsync
per file, and the rename only counts once the data it names is on disk.

A full filesystem (ENOSPC, EDQUOT) while writing becomes StoreFullError.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from pool.backends.local import staging
from pool.errors import StoreFullError

RECORD_MODE = 0o444
_FULL = (errno.ENOSPC, errno.EDQUOT)
_libc = ctypes.CDLL(None, use_errno=True)


def write_file(path: Path, data: bytes, *, mode: int = RECORD_MODE) -> None:
    """Replace ``path`` with ``data`` atomically and durably, leaving it with ``mode``."""
    tmp = path.with_name(staging.new_name(".part"))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make the entries of a directory (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_filesystem(path: Path) -> None:
    """Flush everything written to the filesystem holding ``path`` (syncfs)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs of {path}: {os.strerror(err)}")
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
