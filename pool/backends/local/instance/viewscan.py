"""List a strict verifier's view of its outputs from the host, without a process in the sandbox.

The protection of the test infrastructure (``envs.tasks.protect``) lists every entry of the outputs
whose name matches a pattern. In the sandbox that is ``sh`` + ``find`` (two program starts per
episode); here the host walks the same mounted tree the verifier's processes see, through the
sandbox init's root (``/proc/<pid>/root``, opened while a pidfd proves the init is the sandbox's),
so overlayfs itself applies the agent's whiteouts, opaque folders and the graft's removed links,
as it does for ``find``.

The walk never follows a link: every folder is opened below its parent's descriptor with
``O_NOFOLLOW | O_DIRECTORY``, names are matched on the entry itself (``lstat``), and a matched
folder is not entered (``find -prune``). Whatever the host cannot walk as ``find`` would (a link
on the way to an output, a folder it cannot open, more folders deep than it may hold open, a
pattern whose glob ``fnmatch`` reads differently from ``find``) answers None: the caller then
runs ``find`` in the sandbox, as before.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
from collections.abc import Sequence
from fnmatch import fnmatchcase

Listing = dict[str, tuple[str, int]]
"""``path -> (kind, mode)``: kind ``f``, ``d`` or ``l`` (``find -printf %y``), mode ``st_mode & 0o7777`` (``%m``)."""

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KINDS = {stat.S_IFREG: "f", stat.S_IFDIR: "d", stat.S_IFLNK: "l"}
_MAX_DEPTH = 256
"""Folders held open at once; a deeper tree is left to ``find``."""


def scan(pid: int, roots: Sequence[str], patterns: Sequence[str]) -> Listing | None:
    """The entries below ``roots`` (absolute paths in the sandbox) whose name matches one of ``patterns``,
    as ``find ROOTS -mindepth 1 \\( -name P ... \\) -prune`` lists them in the mount namespace of ``pid``
    (the sandbox's init); None when the host cannot list them exactly so."""
    if not patterns or any("[" in p or "\\" in p for p in patterns):  # fnmatch and find differ on these
        return None
    try:
        root = _open_root(pid)
    except OSError:
        return None
    if root < 0:
        return None
    try:
        found: Listing = {}
        for path in roots:
            if not _scan_root(root, path, tuple(patterns), found):
                return None
        return found
    finally:
        os.close(root)


def _open_root(pid: int) -> int:
    """The root folder of ``pid``'s mount namespace, or -1 when ``pid`` is not the process it was."""
    pidfd = os.pidfd_open(pid)
    try:
        root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            signal.pidfd_send_signal(pidfd, 0)  # still alive: the /proc entry opened was this process's
        except ProcessLookupError:
            os.close(root)
            return -1
        return root
    finally:
        os.close(pidfd)


def _scan_root(root: int, path: str, patterns: tuple[str, ...], found: Listing) -> bool:
    """Add what ``path`` holds to ``found``; False when the host cannot walk it as ``find`` does."""
    top = _open_path(root, path)
    if top is None:
        return False
    if top < 0:  # missing: find lists nothing
        return True
    prefix = path.rstrip("/")
    stack: list[tuple[int, str, list[os.DirEntry[str]]]] = []
    try:
        stack.append((top, prefix, _entries(top)))
        while stack:
            fd, where, entries = stack[-1]
            if not entries:
                os.close(fd)
                stack.pop()
                continue
            entry = entries.pop()
            name = f"{where}/{entry.name}"
            if any(fnmatchcase(entry.name, p) for p in patterns):
                st = entry.stat(follow_symlinks=False)
                kind = _KINDS.get(stat.S_IFMT(st.st_mode))
                if kind is not None:  # sockets, FIFOs, devices: find's s, p, c, b, which the caller skips
                    found[name] = (kind, st.st_mode & 0o7777)
            elif entry.is_dir(follow_symlinks=False):
                if len(stack) >= _MAX_DEPTH:
                    return False
                child = os.open(entry.name, _DIR, dir_fd=fd)
                stack.append((child, name, _entries(child)))
        return True
    except OSError:
        return False
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _open_path(root: int, path: str) -> int | None:
    """The folder at ``path`` below ``root``, reached without following a link; -1 when it is missing,
    None when a link or something other than a folder is on the way (``find`` would resolve it)."""
    fd = os.dup(root)
    try:
        for part in [p for p in path.split("/") if p]:
            nxt = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError as exc:
        os.close(fd)
        return -1 if exc.errno == errno.ENOENT else None
    return fd


def _entries(fd: int) -> list[os.DirEntry[str]]:
    with os.scandir(fd) as listing:
        return list(listing)
