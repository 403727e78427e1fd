"""A local sandbox's changes, read from its writable overlay layer on the host.

Everything the episode wrote is in the layer (``upper``), and overlayfs's own
marks say the rest: a whiteout (a 0/0 character device) is a removed path, an
opaque directory one whose old contents were removed. Whether a path in the
layer is new or changed is decided by looking its name up in the snapshot's
layers, overlayfs's way: in each folder, the topmost layer that has the name
wins, a whiteout hides it, and an opaque folder hides the layers below. The
walk carries, for each folder it enters, the lower folders that show through
there, so a lookup is one ``lstat`` per layer.

Nothing runs in the sandbox, so the agent cannot edit the listing; the walk
never follows a link, and entries vanishing under it (the agent's processes
still run) are skipped.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pool.backends.local.store.walk import Node, walk
from pool.changes import MAX_ENTRIES_WALKED, MAX_PATHS, ChangeList, Changes
from pool.errors import SnapgymError

_NEW = None
"""The lower folders of a folder with nothing below it: everything under it is added."""


def read_changes(
    upper: Path,
    lower_layers: list[Path],
    *,
    rootless: bool,
    max_paths: int = MAX_PATHS,
    max_entries: int = MAX_ENTRIES_WALKED,
) -> Changes:
    """The paths added, changed and removed in ``upper`` over ``lower_layers`` (bottom first)."""
    found = ChangeList("host", max_paths=max_paths)
    opaque_xattr = "user.overlay.opaque" if rootless else "trusted.overlay.opaque"
    try:
        root_fd = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        found.stop_early()
        return found.result()
    # below[d]: the lower folders (top first) showing through the folder at depth d; None: a new folder
    below: list[list[str] | None] = [[str(layer) for layer in reversed(lower_layers)]]
    try:
        for seen, node in enumerate(walk(root_fd, missing_ok=True)):
            if node.depth == 0:
                continue
            if seen > max_entries:
                found.stop_early()
                break
            del below[node.depth :]
            below.append(_classify(found, node, below[node.depth - 1], opaque_xattr))
    except (OSError, SnapgymError):  # the tree changed under the walk in a way it cannot follow
        found.stop_early()
    finally:
        os.close(root_fd)
    return found.result()


def _classify(found: ChangeList, node: Node, parent: list[str] | None, opaque_xattr: str) -> list[str] | None:
    """Record one entry of the writable layer; for a folder, the lower folders showing through it."""
    path = "/" + os.fsdecode(node.path())
    is_dir = stat.S_ISDIR(node.st.st_mode)
    shown = path + "/" if is_dir else path
    if parent is _NEW:
        found.add("added", shown)
        return _NEW
    if stat.S_ISCHR(node.st.st_mode) and node.st.st_rdev == 0:
        found.add("removed", path)
        return _NEW
    lower = _lookup(parent, node.name)
    if lower is None:
        found.add("added", shown)
        return _NEW
    if not is_dir:
        found.add("changed", path)
        return _NEW
    if not stat.S_ISDIR(lower.st_mode) or _is_opaque(node.fd, opaque_xattr):
        found.add("changed", shown)  # a new folder in place of the old entry: nothing below shows through
        return _NEW
    return _lower_folders(parent, node.name, opaque_xattr)


def _lookup(folders: list[str], name: str) -> os.stat_result | None:
    """The topmost lower entry ``name`` in ``folders``; None when no layer has it or a whiteout hides it."""
    for folder in folders:
        try:
            st = os.lstat(os.path.join(folder, name))
        except OSError:
            continue
        return None if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0 else st
    return None


def _lower_folders(folders: list[str], name: str, opaque_xattr: str) -> list[str]:
    """The lower folders showing through the folder ``name``: from the top down, until one is opaque
    or a layer has something else there."""
    shown = []
    for folder in folders:
        candidate = os.path.join(folder, name)
        try:
            st = os.lstat(candidate)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            break
        shown.append(candidate)
        if _is_opaque(candidate, opaque_xattr):
            break
    return shown


def _is_opaque(folder: str | int, opaque_xattr: str) -> bool:
    """Whether the folder (a path, never followed, or an open descriptor) is marked opaque."""
    try:
        if isinstance(folder, int):
            return os.getxattr(folder, opaque_xattr) == b"y"
        return os.getxattr(folder, opaque_xattr, follow_symlinks=False) == b"y"
    except OSError:
        return False
