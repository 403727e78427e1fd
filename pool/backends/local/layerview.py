"""Read a path out of a stack of overlay layers on the host, as the mounted overlay would show it.

Used by ``COPY --from=<image>``: the files come out of the image's stored
layers without starting a sandbox over them (an image such as
``ghcr.io/astral-sh/uv`` has no shell to run ``tar`` with). The rules are
overlayfs's: the topmost layer that has a name wins, a whiteout (a 0/0
character device) hides the name below it, and an opaque directory hides
everything below it.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pool.errors import BuildError

_MAX_ENTRIES = 200_000


@dataclass(frozen=True, slots=True)
class Entry:
    """One name in the merged view."""

    path: str
    """Relative to the copied source ("" for the source itself)."""
    host_path: Path
    """Where its content lives (in the topmost layer that has it)."""
    mode: int
    """``st_mode`` (type and permission bits)."""


class LayerView:
    """The merged view of ``layers`` (bottom first, as snapshots list them)."""

    def __init__(self, layers: list[Path], *, rootless: bool) -> None:
        self._top_first = list(reversed(layers))
        self._opaque_xattr = "user.overlay.opaque" if rootless else "trusted.overlay.opaque"

    def lookup(self, path: str) -> Entry | None:
        """The entry at an absolute ``path`` (links are not followed), or None when it does not exist."""
        parts = [p for p in posixpath.normpath(path).split("/") if p]
        found: Entry | None = None
        for layer in self._top_first:
            host = layer.joinpath(*parts) if parts else layer
            try:
                st = os.lstat(host)
            except (FileNotFoundError, NotADirectoryError):
                if self._hidden_below(layer, parts):
                    return None
                continue
            if _is_whiteout(st):
                return None
            found = Entry("", host, st.st_mode)
            break
        return found

    def walk(self, path: str) -> Iterator[Entry]:
        """The entry at ``path`` and, for a directory, everything below it in the merged view.

        Raises:
            BuildError: ``path`` does not exist in the image, or holds more than 200,000 entries.
        """
        top = self.lookup(path)
        if top is None:
            raise BuildError(f"{path} does not exist in the image")
        yield top
        if not stat.S_ISDIR(top.mode):
            return
        count = 0
        stack = [""]
        base = [p for p in posixpath.normpath(path).split("/") if p]
        while stack:
            rel = stack.pop()
            for name, entry in sorted(self._children([*base, *rel.split("/")] if rel else base).items()):
                count += 1
                if count > _MAX_ENTRIES:
                    raise BuildError(f"{path} holds more than {_MAX_ENTRIES} entries; copy a smaller folder")
                child = posixpath.join(rel, name) if rel else name
                yield Entry(child, entry.host_path, entry.mode)
                if stat.S_ISDIR(entry.mode):
                    stack.append(child)

    def _children(self, parts: list[str]) -> dict[str, Entry]:
        merged: dict[str, Entry] = {}
        hidden: set[str] = set()
        for layer in self._top_first:
            folder = layer.joinpath(*parts)
            try:
                names = os.listdir(folder)
            except (FileNotFoundError, NotADirectoryError):
                if self._hidden_below(layer, parts):
                    break
                continue
            for name in names:
                if name in merged or name in hidden:
                    continue
                st = os.lstat(folder / name)
                if _is_whiteout(st):
                    hidden.add(name)
                else:
                    merged[name] = Entry(name, folder / name, st.st_mode)
            if self._is_opaque(folder):
                break
        return merged

    def _hidden_below(self, layer: Path, parts: list[str]) -> bool:
        """True when this layer hides the path in the layers below (a whiteout or opaque dir on the way)."""
        current = layer
        for part in parts:
            try:
                st = os.lstat(current / part)
            except (FileNotFoundError, NotADirectoryError):
                return self._is_opaque(current)
            if _is_whiteout(st):
                return True
            if not stat.S_ISDIR(st.st_mode):
                return True  # a file here replaces a folder below
            current = current / part
        return False

    def _is_opaque(self, folder: Path) -> bool:
        try:
            return os.getxattr(folder, self._opaque_xattr, follow_symlinks=False) == b"y"
        except OSError:
            return False


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
