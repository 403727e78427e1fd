"""Merkle digests of directory trees, for proving two start states identical.

Each entry hashes its type, name, permission bits, owner, and its content (file
bytes, link target, device numbers, overlay xattrs); a directory hashes its
sorted children. Timestamps are left out on purpose: they differ between two
builds of the same content and say nothing about the state an agent sees.
"""

from __future__ import annotations

import hashlib
import os
import stat

_CHUNK = 1 << 20
# Extended attributes that are part of a layer's content: whiteout/opaque
# markers and file capabilities. Overlay bookkeeping (uuid, origin, impure)
# belongs to one mount and is not content.
CONTENT_XATTRS = frozenset(
    f"{ns}.overlay.{name}" for ns in ("trusted", "user") for name in ("opaque", "whiteout", "whiteouts")
) | {"security.capability"}


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes, read without following a final symlink."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while chunk := os.read(fd, _CHUNK):
            h.update(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


def tree_digest(root: str | os.PathLike[str], *, id_offset: int = 0) -> str:
    """The Merkle digest of the tree under ``root`` (``root`` itself included).

    Args:
        root: directory to hash; symlinks are hashed as links, never followed.
        id_offset: subtracted from owners, so a layer stored with shifted ids
            hashes the same as its unshifted twin.
    """
    return _entry_digest(os.fspath(root), "", id_offset)


def _entry_digest(path: str, name: str, id_offset: int) -> str:
    st = os.lstat(path)
    h = hashlib.sha256()
    kind = stat.S_IFMT(st.st_mode)
    owner = f"{max(st.st_uid - id_offset, -1)}:{max(st.st_gid - id_offset, -1)}"
    h.update(f"{kind:o}\0{name}\0{stat.S_IMODE(st.st_mode):o}\0{owner}\0".encode("utf-8", "surrogateescape"))
    if stat.S_ISREG(kind):
        h.update(file_sha256(path).encode())
    elif stat.S_ISLNK(kind):
        h.update(os.fsencode(os.readlink(path)))
    elif stat.S_ISCHR(kind) or stat.S_ISBLK(kind):
        h.update(f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}".encode())
    elif stat.S_ISDIR(kind):
        children = sorted(os.listdir(path))
        for child in children:
            h.update(os.fsencode(child) + b"\0")
            h.update(_entry_digest(os.path.join(path, child), child, id_offset).encode())
    if not stat.S_ISLNK(kind):
        h.update(_overlay_xattrs(path))
    return h.hexdigest()


def _overlay_xattrs(path: str) -> bytes:
    try:
        names = sorted(n for n in os.listxattr(path, follow_symlinks=False) if n in CONTENT_XATTRS)
    except OSError:
        return b""
    out = b""
    for n in names:
        # Which namespace (trusted/user) depends on rootless mode, not content.
        out += (
            n.removeprefix("trusted.").removeprefix("user.").encode()
            + b"="
            + os.getxattr(path, n, follow_symlinks=False)
            + b"\0"
        )
    return out


def combine(*parts: str) -> str:
    """One digest naming an ordered sequence of digests (e.g. a layer stack)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\n")
    return h.hexdigest()
