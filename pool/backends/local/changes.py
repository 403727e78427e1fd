"""A local sandbox's changes, read from its writable overlay layer on the host.

Everything the episode wrote is in the layer (``upper``), and overlayfs's own
marks say the rest: a whiteout (a 0/0 character device) is a removed path, an
opaque directory one whose old contents were removed. Whether a path in the
layer is new or changed is decided by looking it up in the snapshot's layers
(:class:`LayerView`). Nothing runs in the sandbox, so the agent cannot edit the
listing; the walk never follows a link, and entries vanishing under it (the
agent's processes still run) are skipped.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pool.backends.local.layerview import LayerView
from pool.backends.local.walk import walk
from pool.changes import MAX_ENTRIES_WALKED, MAX_PATHS, ChangeList, Changes
from pool.errors import SnapgymError


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
    view = LayerView(lower_layers, rootless=rootless)
    opaque_xattr = "user.overlay.opaque" if rootless else "trusted.overlay.opaque"
    new_below: list[bytes] = []  # directories whose whole content is new (their prefixes, with "/")
    try:
        root_fd = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        found.stop_early()
        return found.result()
    try:
        for seen, node in enumerate(walk(root_fd, missing_ok=True)):
            if node.depth == 0:
                continue
            if seen > max_entries:
                found.stop_early()
                break
            relative = node.path()
            while new_below and not relative.startswith(new_below[-1]):
                new_below.pop()
            _classify(found, view, node.st, relative, node.proc_path(), opaque_xattr, new_below)
    except (OSError, SnapgymError):  # the tree changed under the walk in a way it cannot follow
        found.stop_early()
    finally:
        os.close(root_fd)
    return found.result()


def _classify(
    found: ChangeList,
    view: LayerView,
    st: os.stat_result,
    relative: bytes,
    proc_path: str,
    opaque_xattr: str,
    new_below: list[bytes],
) -> None:
    """Record one entry of the writable layer (``new_below``: the enclosing new directories)."""
    path = "/" + os.fsdecode(relative)
    is_dir = stat.S_ISDIR(st.st_mode)
    shown = path + "/" if is_dir else path
    if new_below:
        found.add("added", shown)
        if is_dir:
            new_below.append(relative + b"/")
        return
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
        found.add("removed", path)
        return
    below = view.lookup(path.strip("/").split("/"))
    if below is None:
        found.add("added", shown)
    elif not is_dir:
        found.add("changed", path)
    elif not stat.S_ISDIR(below.mode) or _is_opaque(proc_path, opaque_xattr):
        found.add("changed", shown)  # a new directory in place of the old entry: nothing below shows through
    else:
        return
    if is_dir:
        new_below.append(relative + b"/")


def _is_opaque(proc_path: str, opaque_xattr: str) -> bool:
    try:
        return os.getxattr(proc_path, opaque_xattr) == b"y"
    except OSError:
        return False
