"""Iterative walks of directory trees through directory file descriptors.

Every entry is reached relative to its parent's descriptor (``openat``-style),
never by a path from the root, and symlinks are never followed: a tree written
by untrusted code cannot redirect the walk, and a tree deeper than PATH_MAX or
than Python's recursion limit walks like any other. Only the deepest
``_KEEP_OPEN`` ancestors hold a descriptor at once; when the walk climbs back to
an ancestor whose descriptor was closed, it reopens it as ``..`` of the child
and checks that it is the same directory (device and inode), so a tree 100,000
levels deep stays far under the descriptor limit.

Children are visited sorted by name as bytes, the canonical order of
:mod:`pool.build.digest`. A node carries its depth and name; its full path is only
built on demand (:meth:`Node.path`), so a walk of a deep tree costs linear time
and memory, not quadratic.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from pool.errors import SnapshotError

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KEEP_OPEN = 32
_Part = TypeVar("_Part", str, bytes)


@dataclass(slots=True)
class Node:
    """One entry reached by :func:`walk`."""

    depth: int
    """0 for the root, 1 for its entries, and so on."""
    name: str
    """The last component (``""`` for the root), for calls relative to ``dir_fd``."""
    st: os.stat_result
    """lstat of the entry, taken when the walk reached it."""
    dir_fd: int
    """Descriptor of the directory holding the entry; -1 for the root."""
    fd: int = -1
    """A directory's own descriptor while the walk is at it; -1 otherwise."""
    leaving: bool = False
    """True for the second visit of a directory, after its children (``leaving=True`` walks)."""
    parents: list[_Frame] = field(default_factory=list, repr=False)

    def path(self) -> bytes:
        """The path relative to the root (``b""`` for the root); valid while the walk is here."""
        if self.depth == 0:
            return b""
        return b"/".join([*(frame.bname for frame in self.parents[1 : self.depth]), os.fsencode(self.name)])

    def proc_path(self) -> str:
        """A short path naming this entry without following it (valid while the walk is here)."""
        if self.fd >= 0:
            return f"/proc/self/fd/{self.fd}"
        return f"/proc/self/fd/{self.dir_fd}/{self.name}"


@dataclass(slots=True)
class _Frame:
    depth: int
    name: str
    bname: bytes
    st: os.stat_result
    names: list[str]
    next: int = 0


@dataclass(slots=True)
class FdStack:
    """Descriptors of the directories on the current path, the deepest ones open."""

    fds: list[int] = field(default_factory=list)
    ids: list[tuple[int, int]] = field(default_factory=list)

    def push(self, fd: int, st: os.stat_result) -> None:
        """Own ``fd`` (the directory ``st`` describes) as the new deepest directory."""
        self.fds.append(fd)
        self.ids.append((st.st_dev, st.st_ino))
        shallow = len(self.fds) - _KEEP_OPEN - 1
        if shallow >= 0 and self.fds[shallow] >= 0:
            os.close(self.fds[shallow])
            self.fds[shallow] = -1

    def top(self) -> int:
        """The deepest directory's descriptor (always open)."""
        return self.fds[-1]

    def pop(self) -> None:
        """Close the deepest directory; its parent becomes the deepest, reopened if need be."""
        fd = self.fds.pop()
        self.ids.pop()
        try:
            if self.fds and self.fds[-1] < 0:
                self.fds[-1] = _reopen_parent(fd, self.ids[-1])
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close every descriptor still open."""
        for fd in self.fds:
            if fd >= 0:
                os.close(fd)
        self.fds.clear()


def walk(root_fd: int, *, leaving: bool = False, missing_ok: bool = False, force: bool = False) -> Iterator[Node]:
    """Every entry under (and including) the directory ``root_fd``, in canonical preorder.

    Args:
        root_fd: an open directory; the walk works on its own duplicate.
        leaving: also yield each directory again after its children, with
            ``dir_fd`` open on its parent (the root's second visit has -1).
        missing_ok: skip entries that vanish while the walk runs (removal by
            two processes at once) instead of raising FileNotFoundError.
        force: make a directory the walk may not read accessible (chmod 0700)
            before entering it; for removing trees as their owner.

    A node's descriptors are valid until the walk moves on.
    """
    stack = FdStack()
    fd = os.dup(root_fd)
    st = os.fstat(fd)
    stack.push(fd, st)
    frames: list[_Frame] = []
    try:
        yield Node(0, "", st, -1, fd, parents=frames)
        frames.append(_Frame(0, "", b"", st, list_names(fd)))
        while frames:
            frame = frames[-1]
            if frame.next == len(frame.names):
                frames.pop()
                stack.pop()
                if leaving:
                    parent = stack.top() if frames else -1
                    yield Node(frame.depth, frame.name, frame.st, parent, leaving=True, parents=frames)
                continue
            name = frame.names[frame.next]
            frame.next += 1
            parent = stack.top()
            depth = frame.depth + 1
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                fd = open_dir(parent, name, st, force=force) if stat.S_ISDIR(st.st_mode) else -1
            except FileNotFoundError:
                if missing_ok:
                    continue
                raise
            if fd < 0:
                yield Node(depth, name, st, parent, parents=frames)
                continue
            stack.push(fd, st)
            yield Node(depth, name, st, parent, fd, parents=frames)
            frames.append(_Frame(depth, name, os.fsencode(name), st, list_names(fd)))
    finally:
        stack.close()


def list_names(fd: int) -> list[str]:
    """The names in a directory, sorted as bytes."""
    with os.scandir(fd) as it:
        names = [entry.name for entry in it]
    names.sort(key=os.fsencode)
    return names


def open_dir(parent: int, name: str, st: os.stat_result, *, force: bool = False) -> int:
    """Open the directory ``name`` under ``parent`` and check it is the one lstat saw."""
    try:
        fd = os.open(name, O_DIR, dir_fd=parent)
    except PermissionError:
        if not force:
            raise
        _make_accessible(parent, name)
        fd = os.open(name, O_DIR, dir_fd=parent)
    return _checked(fd, st, name)


def open_file(node: Node) -> int:
    """Open a regular file reached by the walk, checking it was not swapped meanwhile."""
    return _checked(os.open(node.name, O_FILE, dir_fd=node.dir_fd), node.st, node.name)


def open_under(root_fd: int, rel: bytes) -> int:
    """A directory at a relative path of any length, opened component by component."""
    return descend(root_fd, rel.split(b"/") if rel else (), lambda fd, part: os.open(part, O_DIR, dir_fd=fd))


def descend(root_fd: int, parts: Iterable[_Part], open_child: Callable[[int, _Part], int]) -> int:
    """The directory ``parts`` below ``root_fd``, each component opened by ``open_child(parent_fd, part)``.

    Only one descriptor is held at a time: a parent is closed once its child is opened (or fails to open),
    so a path of any depth costs one descriptor, and the caller owns the one returned.
    """
    fd = os.dup(root_fd)
    for part in parts:
        try:
            child = open_child(fd, part)
        finally:
            os.close(fd)
        fd = child
    return fd


def _checked(fd: int, st: os.stat_result, name: str) -> int:
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise SnapshotError(f"{name!r} was replaced while its tree was being read; take the snapshot again")
    return fd


def _reopen_parent(child_fd: int, ident: tuple[int, int]) -> int:
    fd = os.open("..", O_DIR, dir_fd=child_fd)
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != ident:
        os.close(fd)
        raise SnapshotError("a directory was moved while its tree was being read; take the snapshot again")
    return fd


def _make_accessible(parent: int, name: str) -> None:
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.chmod(f"/proc/self/fd/{fd}", 0o700)
    finally:
        os.close(fd)
