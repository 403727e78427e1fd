"""The mount-point layer: the folders the daemon mounts over, on top of a root filesystem's layers.

A sandbox gets its own ``/proc``, ``/dev`` and ``/tmp``, and files bound into
``/etc`` and ``/root``; the daemon needs each to be a folder in the merged tree.
A root filesystem or image may lack some, so every base ends with this small
layer holding all of them. Each takes the mode and owner the layers below give
it (found top-down, as overlayfs would), so an image's ``/root`` stays 0700;
where the layers below have none, it is root's 0755 (``/tmp`` 1777).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from pool.backends.local.store.layers import LayerStore, shift_owners

MOUNT_POINTS = ("proc", "dev", "tmp", "root", "etc")
_DEFAULT_MODES = {"tmp": 0o1777}


def mount_point_layer(layers: LayerStore, *, below: Sequence[Path] = ()) -> tuple[str, str]:
    """Commit the mount-point layer into ``layers``; (layer id, digest).

    Args:
        layers: the store's layers (its ``id_offset`` shifts the owners).
        below: the trees of the layers it goes on, bottom first; empty: default modes and owners
            (root, 0755, ``/tmp`` 1777), the layer every root filesystem base has had.
    """
    with layers.staging("writing the mount-point layer") as staged:
        for name in MOUNT_POINTS:
            (staged / name).mkdir()
            os.chmod(staged / name, _DEFAULT_MODES.get(name, 0o755))
        shift_owners(staged, layers.id_offset)
        for name in MOUNT_POINTS:
            found = _topmost_dir(below, name)
            if found is not None:
                _copy_attrs(found, staged / name)
        return layers.commit(staged)


def _topmost_dir(below: Sequence[Path], name: str) -> os.stat_result | None:
    """The folder ``name`` as the merged tree of ``below`` shows it; None when it is absent or not a folder."""
    for tree in reversed(below):
        try:
            st = os.lstat(tree / name)
        except FileNotFoundError:
            continue
        return st if stat.S_ISDIR(st.st_mode) else None  # a file, link or whiteout hides what is below
    return None


def _copy_attrs(found: os.stat_result, path: Path) -> None:
    if os.geteuid() == 0:
        os.chown(path, found.st_uid, found.st_gid)  # the layers below are shifted already
    os.chmod(path, stat.S_IMODE(found.st_mode))
