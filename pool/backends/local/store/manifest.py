"""A layer's manifest: what its digest was computed from, so the layer can be checked cheaply.

Written when the layer is committed. For each entry, in the digest's canonical
order, it holds the digest's inputs (depth, name, type, permission bits, owner,
payload, content xattrs) and the stat key the entry had when it was hashed (size, inode,
mtime_ns, ctime_ns). Checking a layer is then one lstat walk: structure, types,
modes, owners and hard-link groups are compared for every entry, and an entry's
payload is read again only where its stat key changed, or where it is *racy*
(its ctime is not older than the moment hashing began, so an edit in the same
clock tick could hide behind an unchanged ctime; git's index has the same rule).
Writing, truncating, chmod, chown, setxattr and link all move ctime forward,
and no system call sets it back, so an edit through the filesystem cannot pass
unseen; only writing the block device under it can, and ``deep`` checks (used
by ``LocalBackend.verify``) rehash everything.

A manifest is itself checked before it is trusted: its entries must hash to its
digest and that digest must start with the layer id, the layer's name, so an
edited manifest is caught like an edited file.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pool.backends.local.store import walk
from pool.build import digest
from pool.build.digest import Entry
from pool.errors import SnapshotCorruptError

StatKey = tuple[int, int, int, int]
# The clock file timestamps are taken from (Python does not name it); never ahead of them.
_CLOCK_REALTIME_COARSE = 5
_KINDS = {
    stat.S_IFDIR: "d",
    stat.S_IFREG: "f",
    stat.S_IFLNK: "l",
    stat.S_IFCHR: "c",
    stat.S_IFBLK: "b",
    stat.S_IFIFO: "p",
}


@dataclass(frozen=True, slots=True)
class Manifest:
    """The digest of a layer and the entries it was computed from."""

    digest: str
    sealed_ns: int
    """Coarse clock time before hashing began; entries changed at or after it are re-read."""
    entries: tuple[Entry, ...]
    keys: tuple[StatKey, ...]

    def to_json(self) -> bytes:
        """Serialise for the store."""
        rows = [
            [e.depth, os.fsdecode(e.name), e.kind, e.perm, e.uid, e.gid, os.fsdecode(e.payload), _attrs(e), *key]
            for e, key in zip(self.entries, self.keys, strict=True)
        ]
        data = {"format": digest.FORMAT, "digest": self.digest, "sealed_ns": self.sealed_ns, "entries": rows}
        return json.dumps(data, separators=(",", ":")).encode()


def _attrs(entry: Entry) -> list[list[str]]:
    return [[name, value.hex()] for name, value in entry.xattrs]


class _Differs(Exception):
    def __init__(self, path: bytes, what: str) -> None:
        super().__init__(what)
        self.path = path
        self.what = what


def _path_of(entries: tuple[Entry, ...], index: int) -> bytes:
    """The path of entry ``index``, rebuilt from the depths and names up to it."""
    names: list[bytes] = []
    depth = entries[index].depth + 1
    for entry in reversed(entries[: index + 1]):
        if 0 < entry.depth < depth:
            names.append(entry.name)
            depth = entry.depth
    return b"/".join(reversed(names))


def scan(root: Path, *, id_offset: int) -> Manifest:
    """Hash every entry of a tree; the manifest of what it holds now."""
    sealed = time.clock_gettime_ns(_CLOCK_REALTIME_COARSE)
    entries: list[Entry] = []
    keys: list[StatKey] = []
    links: dict[tuple[int, int], int] = {}
    for node in _walk(root):
        entry = _observe(node, len(entries), id_offset, links, None)
        if entry is not None:
            entries.append(entry)
            keys.append(_key(node.st))
    return Manifest(digest.digest_entries(entries), sealed, tuple(entries), tuple(keys))


def load(path: Path, layer_id: str) -> Manifest | None:
    """The layer's manifest, or None when it is missing, of another format or inconsistent."""
    try:
        data: dict[str, Any] = json.loads(path.read_bytes())
        if data.get("format") != digest.FORMAT:
            return None
        entries = tuple(_entry(row) for row in data["entries"])
        keys = tuple((row[8], row[9], row[10], row[11]) for row in data["entries"])
        found = Manifest(data["digest"], int(data["sealed_ns"]), entries, keys)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    if not found.digest.startswith(layer_id) or digest.digest_entries(found.entries) != found.digest:
        return None
    return found


def check(root: Path, manifest: Manifest, *, layer_id: str, id_offset: int, deep: bool = False) -> Manifest | None:
    """Compare a layer with its manifest; a refreshed manifest when entries had to be re-read.

    Raises:
        SnapshotCorruptError: naming the layer and the first differing path.
    """
    sealed = time.clock_gettime_ns(_CLOCK_REALTIME_COARSE)
    links: dict[tuple[int, int], int] = {}
    keys: list[StatKey] = []
    entries = manifest.entries
    reread = 0
    index = 0
    try:
        for node in _walk(root):
            if stat.S_IFMT(node.st.st_mode) not in _KINDS:
                continue  # sockets: not content, left out of the digest
            expected = entries[index] if index < len(entries) else None
            if expected is None or (expected.depth, expected.name) != (node.depth, os.fsencode(node.name)):
                raise _structure_change(node, entries, index)
            key = _key(node.st)
            trusted = not deep and key == manifest.keys[index] and node.st.st_ctime_ns < manifest.sealed_ns
            entry = _observe(node, index, id_offset, links, expected if trusted else None)
            assert entry is not None  # sockets were skipped above
            if entry != expected:
                raise _Differs(node.path(), _difference(expected, entry))
            reread += not trusted and expected.kind != "d"  # a directory's xattrs are always re-read
            keys.append(key)
            index += 1
        if index < len(entries):
            raise _Differs(_path_of(entries, index), "this entry is missing")
    except _Differs as exc:
        raise SnapshotCorruptError(
            f"layer {layer_id} at {root} differs from its digest at {_show(exc.path)}: {exc.what}. "
            f"Delete the layer ({root}) and build its templates again, or delete the whole store "
            f"({root.parent.parent}); snapshots on that layer cannot be trusted",
            layer_id=layer_id,
            path="/" + os.fsdecode(exc.path),
        ) from None
    if not reread:
        return None
    return Manifest(manifest.digest, sealed, manifest.entries, tuple(keys))


def _walk(root: Path) -> Iterator[walk.Node]:
    fd = os.open(root, walk.O_DIR)
    try:
        yield from walk.walk(fd)
    finally:
        os.close(fd)


def _observe(
    node: walk.Node, index: int, id_offset: int, links: dict[tuple[int, int], int], known: Entry | None
) -> Entry | None:
    """Entry ``index`` as it is now; payload and xattrs taken from ``known`` when its stat key vouches for them."""
    st = node.st
    kind = _KINDS.get(stat.S_IFMT(st.st_mode))
    if kind is None:
        return None  # sockets are not state worth keeping; the copy skips them too
    owner = (max(st.st_uid - id_offset, -1), max(st.st_gid - id_offset, -1))
    name = os.fsencode(node.name)
    perm = stat.S_IMODE(st.st_mode)
    if kind == "f" and st.st_nlink > 1:
        leader = links.setdefault((st.st_dev, st.st_ino), index)
        if leader != index:
            return Entry(node.depth, name, "h", perm, *owner, b"%d" % leader)
    head = (node.depth, name, kind, perm, *owner)
    if known is not None and known.kind == kind and kind != "d":
        return Entry(*head, known.payload, known.xattrs)
    payload, xattrs = _read(node, kind)
    return Entry(*head, payload, xattrs)


def _read(node: walk.Node, kind: str) -> tuple[bytes, tuple[tuple[str, bytes], ...]]:
    if kind == "f":
        fd = walk.open_file(node)
        try:
            return digest.content_hash(fd).encode(), digest.content_xattrs(_listxattr(fd), lambda n: os.getxattr(fd, n))
        finally:
            os.close(fd)
    if kind == "l":
        return os.fsencode(os.readlink(node.name, dir_fd=node.dir_fd)), ()
    target: int | str = node.fd if node.fd >= 0 else node.proc_path()
    attrs = digest.content_xattrs(_listxattr(target), lambda n: _getxattr(target, n))
    if kind in ("c", "b"):
        return b"%d:%d" % (os.major(node.st.st_rdev), os.minor(node.st.st_rdev)), attrs
    return b"", attrs


def _listxattr(target: int | str) -> list[str]:
    try:
        if isinstance(target, int):
            return os.listxattr(target)
        return os.listxattr(target, follow_symlinks=False)
    except OSError:
        return []  # no xattr support: nothing to hash


def _getxattr(target: int | str, name: str) -> bytes:
    if isinstance(target, int):
        return os.getxattr(target, name)
    return os.getxattr(target, name, follow_symlinks=False)


def _key(st: os.stat_result) -> StatKey:
    return (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def _entry(row: list[Any]) -> Entry:
    attrs = tuple((str(n), bytes.fromhex(v)) for n, v in row[7])
    name, payload = os.fsencode(row[1]), os.fsencode(row[6])
    return Entry(int(row[0]), name, row[2], int(row[3]), int(row[4]), int(row[5]), payload, attrs)


def _structure_change(node: walk.Node, entries: tuple[Entry, ...], index: int) -> _Differs:
    """Which comes first in canonical order: an entry the walk found, or one the manifest expects."""
    expected = entries[index] if index < len(entries) else None
    if expected is None or node.depth > expected.depth:
        return _Differs(node.path(), "an entry was added")
    if node.depth == expected.depth and os.fsencode(node.name) < expected.name:
        return _Differs(node.path(), "an entry was added")
    return _Differs(_path_of(entries, index), "this entry is missing")


def _difference(expected: Entry, found: Entry) -> str:
    if expected.kind != found.kind:
        return f"its type changed from {expected.kind!r} to {found.kind!r}"
    if expected.perm != found.perm:
        return f"its mode changed from {expected.perm:o} to {found.perm:o}"
    if (expected.uid, expected.gid) != (found.uid, found.gid):
        return "its owner changed"
    if expected.payload != found.payload:
        return "its content changed" if found.kind == "f" else "its target or link group changed"
    return "its extended attributes changed"


def _show(path: bytes) -> str:
    return repr("/" + os.fsdecode(path))
