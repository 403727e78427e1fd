"""Digests of file trees, for proving two start states identical.

A tree's digest hashes its entries in canonical order (preorder, the children of
a directory sorted by name as bytes). Each entry contributes its depth and name
(which, in preorder, determine the tree; full paths would make a deep tree cost
quadratic space), type, permission bits, owner, content payload and content
xattrs, every field length-prefixed so that no two trees encode alike:

- a regular file's payload is :func:`content_hash`, which skips all-zero blocks,
  so the same bytes digest alike whether the zeros are holes or written out;
- the second and later paths of a hard-link group (regular files only) are kind
  ``h`` with the position of the group's first path in the entry list as
  payload, so a tree of links differs from a tree of copies, and the digest does
  not depend on inode numbers;
- a symlink's payload is its target (never followed); a device's its numbers.

Timestamps are left out on purpose: they differ between two builds of the same
content and say nothing about the state an agent sees. :data:`FORMAT` names this
encoding; records written under another format are not comparable and are
treated as absent by the store.
"""

from __future__ import annotations

import errno
import hashlib
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

FORMAT = 3
"""Version of the digest encoding (1: recursive per-directory hashes, dense file reads; 2: full paths)."""

BLOCK_BYTES = 1 << 16
"""Granularity of :func:`content_hash`: all-zero blocks of this size are skipped."""

_READ_BLOCKS = 16
_ZERO = bytes(BLOCK_BYTES)
# Extended attributes that are part of a layer's content: whiteout/opaque
# markers and file capabilities. Overlay bookkeeping (uuid, origin, impure)
# belongs to one mount and is not content.
CONTENT_XATTRS = frozenset(
    f"{ns}.overlay.{name}" for ns in ("trusted", "user") for name in ("opaque", "whiteout", "whiteouts")
) | {"security.capability"}


class Entry(NamedTuple):
    """One entry of a tree, as the digest sees it."""

    depth: int
    """0 for the root, 1 for its entries, and so on."""
    name: bytes
    """The last component of the path (``b""`` for the root)."""
    kind: str
    """``d`` dir, ``f`` file, ``h`` further link of a file, ``l`` symlink, ``c``/``b`` device, ``p`` FIFO."""
    perm: int
    """Permission bits, set-id and sticky bits included."""
    uid: int
    gid: int
    payload: bytes
    """Content hash (f), link target (l), index of the group's first entry (h), ``major:minor`` (c, b)."""
    xattrs: tuple[tuple[str, bytes], ...] = ()
    """Content xattrs, sorted, namespace (trusted/user) stripped."""


def digest_entries(entries: Iterable[Entry]) -> str:
    """The digest of a tree given as its entries in canonical order."""
    h = hashlib.sha256(b"snapgym-tree-%d\0" % FORMAT)
    for e in entries:
        attrs = b"".join(_field(name.encode()) + _field(value) for name, value in e.xattrs)
        h.update(
            _field(b"%d" % e.depth)
            + _field(e.name)
            + _field(e.kind.encode())
            + _field(b"%o" % e.perm)
            + _field(b"%d:%d" % (e.uid, e.gid))
            + _field(e.payload)
            + _field(attrs)
        )
    return h.hexdigest()


def content_hash(fd: int) -> str:
    """The hash of a regular file's bytes that reads only its data extents.

    The file is cut into :data:`BLOCK_BYTES` blocks; blocks that are all zero,
    whether holes or written zeros, are left out, the others are hashed with
    their index. Holes are found with ``SEEK_DATA``/``SEEK_HOLE``, so a 1 TB
    sparse file hashes in the time its few data blocks take.
    """
    size = os.fstat(fd).st_size
    h = hashlib.sha256(b"snapgym-content-%d\0%d\0" % (FORMAT, size))
    next_block = 0
    for start, end in data_extents(fd, size):
        first = max(start // BLOCK_BYTES, next_block)
        stop = (end + BLOCK_BYTES - 1) // BLOCK_BYTES
        for index in range(first, stop, _READ_BLOCKS):
            count = min(_READ_BLOCKS, stop - index)
            chunk = os.pread(fd, count * BLOCK_BYTES, index * BLOCK_BYTES)
            for j in range(0, len(chunk), BLOCK_BYTES):
                block = chunk[j : j + BLOCK_BYTES]
                if block != _ZERO[: len(block)]:
                    h.update(struct.pack("<Q", index + j // BLOCK_BYTES) + block)
        next_block = max(next_block, stop)
    return h.hexdigest()


def data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """(start, end) byte ranges of a file that may hold data; holes between them read as zeros."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data past offset
                return
            if exc.errno != errno.EINVAL:
                raise
            yield offset, size  # a filesystem that cannot tell holes apart: read it all
            return
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        if end <= start:
            return
        yield start, end
        offset = end


def content_xattrs(names: Iterable[str], read: Callable[[str], bytes]) -> tuple[tuple[str, bytes], ...]:
    """Content xattrs among ``names``, read with ``read(name)``, namespace stripped and sorted."""
    # Which namespace (trusted/user) depends on rootless mode, not content.
    found = [(_strip_namespace(n), read(n)) for n in names if n in CONTENT_XATTRS]
    return tuple(sorted(found))


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes, read without following a final symlink."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


def combine(*parts: str) -> str:
    """One digest naming an ordered sequence of digests (e.g. a layer stack)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\n")
    return h.hexdigest()


def _field(value: bytes) -> bytes:
    return struct.pack("<Q", len(value)) + value


def _strip_namespace(name: str) -> str:
    return name.removeprefix("trusted.").removeprefix("user.")


def source_key(source: Path) -> str:
    """A cheap identity of a root filesystem source: a tarball's sha256, or a folder's listing
    (paths, sizes, modification times, modes). Not a content digest: it names a cache entry."""
    if source.is_file():
        return file_sha256(source)
    h = hashlib.sha256(str(source.resolve()).encode())
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames.sort()
        for name in sorted(filenames):
            st = os.lstat(os.path.join(dirpath, name))
            h.update(f"{dirpath}/{name}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode}\n".encode())
    return h.hexdigest()
