"""Read a file straight from a sandbox's writable layer, on the host side.

A strict verifier's private directories are created empty in its writable
layer, so everything in them is there: the reward file can be read with a few
``openat`` calls instead of a process in the sandbox. Every component is
opened without following links (a link the verifier made is resolved by the
sandbox instead: :func:`read` answers None), so nothing in the layer can lead
the host outside it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from pool.errors import FileOperationError

_CHUNK = 1 << 20


def read(upper: Path, path: str, max_bytes: int | None) -> bytes | None:
    """The bytes of ``path`` (absolute, in the sandbox) in the writable layer ``upper``.

    Returns None when a link is on the way: the caller asks the sandbox.

    Raises:
        FileOperationError: missing (a whiteout too), not a regular file, or over ``max_bytes``.
    """
    parts = [part for part in path.split("/") if part]
    try:
        fd = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _error(exc.errno or errno.EIO, path) from None
    try:
        for part in parts[:-1]:
            fd = _step(fd, part, path)
            if fd < 0:
                return None
        return _read_file(fd, parts[-1], path, max_bytes)
    finally:
        if fd >= 0:
            os.close(fd)


def _step(fd: int, part: str, path: str) -> int:
    """The directory ``part`` below ``fd`` (closed), or -1 when it is a link."""
    try:
        st = os.stat(part, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            os.close(fd)
            return -1
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
            raise OSError(errno.ENOENT, "a whiteout")
        nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError as exc:
        os.close(fd)
        raise _error(exc.errno or errno.EIO, path) from None
    os.close(fd)
    return nxt


def _read_file(fd: int, name: str, path: str, max_bytes: int | None) -> bytes | None:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError as exc:
        raise _error(exc.errno or errno.EIO, path) from None
    if stat.S_ISLNK(st.st_mode):
        return None
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # a whiteout: deleted in this layer
        raise _error(errno.ENOENT, path)
    if stat.S_ISDIR(st.st_mode):
        raise _error(errno.EISDIR, path)
    if not stat.S_ISREG(st.st_mode):
        raise _error(errno.EINVAL, path)
    if max_bytes and st.st_size > max_bytes:
        raise _error(errno.EFBIG, path)
    file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    try:
        chunks, total = [], 0
        while chunk := os.read(file, _CHUNK):
            chunks.append(chunk)
            total += len(chunk)
            if max_bytes and total > max_bytes:
                raise _error(errno.EFBIG, path)
        return b"".join(chunks)
    finally:
        os.close(file)


def _error(err: int, path: str) -> FileOperationError:
    return FileOperationError(err, f"cannot read {path} in the sandbox: {os.strerror(err)}", path)
