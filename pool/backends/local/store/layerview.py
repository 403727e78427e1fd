"""Read a path out of a stack of overlay layers on the host, as the mounted overlay would show it.

Used by ``COPY --from=<image>``: the files come out of the image's stored
layers without starting a sandbox over them (an image such as
``ghcr.io/astral-sh/uv`` has no shell to run ``tar`` with). The rules are
overlayfs's: the topmost layer that has a name wins, a whiteout (a 0/0
character device) hides the name below it, an opaque directory hides
everything below it, and a lower layer's entry shows through only where
every folder above it is a folder in that layer too.

The layers hold whatever the image's author put there, so nothing here
follows a link on the host: every path component is checked with ``lstat``
before the next one is looked up below it. Links inside the image (``/bin`` ->
``usr/bin``) are resolved in the merged view, confined to the image's root,
as Docker resolves the source of a ``COPY --from``.
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
_MAX_LINKS = 40


@dataclass(frozen=True, slots=True)
class Entry:
    """One name in the merged view."""

    path: str
    """Relative to the copied source ("" for the source itself)."""
    host_path: Path
    """Where its content lives (in the topmost layer that has it); never reached through a link."""
    mode: int
    """``st_mode`` (type and permission bits)."""


@dataclass(frozen=True, slots=True)
class _Probe:
    """What one layer says about a path: it has it (``entry``), hides it from the layers below
    (``hidden``), or says nothing (neither)."""

    entry: Entry | None = None
    hidden: bool = False


class LayerView:
    """The merged view of ``layers`` (bottom first, as snapshots list them)."""

    def __init__(self, layers: list[Path], *, rootless: bool) -> None:
        self._top_first = list(reversed(layers))
        self._opaque_xattr = "user.overlay.opaque" if rootless else "trusted.overlay.opaque"

    def walk(self, path: str) -> Iterator[Entry]:
        """The entry at ``path`` (links before its last component resolved in the image) and, for a
        directory, everything below it; links inside are kept as links.

        Raises:
            BuildError: ``path`` does not exist in the image, its links loop, or it holds more
                than 200,000 entries.
        """
        parts = self._resolve(path)
        top = self._lookup(parts)
        if top is None:
            raise BuildError(f"{path} does not exist in the image")
        yield Entry("", top.host_path, top.mode)
        if not stat.S_ISDIR(top.mode):
            return
        count = 0
        stack: list[list[str]] = [[]]
        while stack:
            rel = stack.pop()
            for name, entry in sorted(self._children([*parts, *rel]).items()):
                count += 1
                if count > _MAX_ENTRIES:
                    raise BuildError(f"{path} holds more than {_MAX_ENTRIES} entries; copy a smaller folder")
                yield Entry("/".join([*rel, name]), entry.host_path, entry.mode)
                if stat.S_ISDIR(entry.mode):
                    stack.append([*rel, name])

    def entry(self, path: str) -> Entry | None:
        """The entry at ``path`` (links before its last component resolved in the image), or None."""
        try:
            return self._lookup(self._resolve(path))
        except (BuildError, OSError):
            return None

    def names(self, path: str) -> frozenset[str]:
        """The names in the folder at ``path`` (every link on the way resolved in the image); empty if none."""
        try:
            parts = self._resolve(path + "/x")[:-1]
            top = self._lookup(parts)
            return frozenset(self._children(parts)) if top is not None and stat.S_ISDIR(top.mode) else frozenset()
        except (BuildError, OSError):
            return frozenset()

    def _lookup(self, parts: list[str]) -> Entry | None:
        for layer in self._top_first:
            probe = self._probe(layer, parts)
            if probe.entry is not None:
                return probe.entry
            if probe.hidden:
                return None
        return None

    def _probe(self, layer: Path, parts: list[str]) -> _Probe:
        """Walk down one layer with lstat only: a missing name under an opaque folder, a whiteout,
        or a non-folder on the way hides the layers below."""
        current = layer
        for index, part in enumerate(parts):
            candidate = current / part
            try:
                st = os.lstat(candidate)
            except FileNotFoundError:
                return _Probe(hidden=self._is_opaque(current))
            if _is_whiteout(st):
                return _Probe(hidden=True)
            if index == len(parts) - 1:
                return _Probe(entry=Entry(part, candidate, st.st_mode))
            if not stat.S_ISDIR(st.st_mode):
                return _Probe(hidden=True)  # a file or link here replaces the folder of the layers below
            current = candidate
        return _Probe(entry=Entry("", layer, os.lstat(layer).st_mode))

    def _children(self, parts: list[str]) -> dict[str, Entry]:
        merged: dict[str, Entry] = {}
        hidden: set[str] = set()
        for layer in self._top_first:
            probe = self._probe(layer, parts)
            if probe.entry is None:
                if probe.hidden:
                    break
                continue
            if not stat.S_ISDIR(probe.entry.mode):
                break
            folder = probe.entry.host_path
            for name in os.listdir(folder):
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

    def _resolve(self, path: str) -> list[str]:
        """The components of ``path`` with every link before the last one resolved in the image."""
        pending = _components(path)
        resolved: list[str] = []
        hops = 0
        while pending:
            part = pending.pop(0)
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = [*resolved, part]
            entry = self._lookup(candidate) if pending else None
            if entry is None or not stat.S_ISLNK(entry.mode):
                resolved = candidate
                continue
            hops += 1
            if hops > _MAX_LINKS:
                raise BuildError(f"{path}: too many levels of symbolic links in the image")
            target = os.readlink(entry.host_path)
            if target.startswith("/"):
                resolved = []
            pending = [p for p in target.split("/") if p and p != "."] + pending
        return resolved

    def _is_opaque(self, folder: Path) -> bool:
        try:
            return os.getxattr(folder, self._opaque_xattr, follow_symlinks=False) == b"y"
        except OSError:
            return False


def _components(path: str) -> list[str]:
    """A source path cleaned lexically, as Docker cleans it (``..`` never climbs above the root)."""
    return [part for part in posixpath.normpath("/" + path).split("/") if part]


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
