"""Reading a run directory's files by relative path, never anything outside it.

Every path the viewer reads, whether a browser asked for it or the ledger
named it, goes through :class:`RunFiles`: a path that is absolute, has an
empty, ``.`` or ``..`` part, a backslash or a NUL, or resolves (symlinks
followed) outside the run directory is refused; only regular files are
opened (a FIFO would block the reader), and the last part is opened without
following a symlink, so a link swapped in after the check is refused too.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from pool.errors import SnapgymError

TEXT_SUFFIXES = frozenset({".txt", ".log", ".json", ".jsonl", ".yaml", ".yml", ".csv", ".md", ".toml", ".sh", ".py"})
"""Served as ``text/plain``: whatever a file holds, a browser shows it and never runs it."""
IMAGE_TYPES = {".png": "image/png"}


class RefusedPathError(SnapgymError, PermissionError):
    """A path that is not a regular file inside the run directory."""


class RunFiles:
    """The files of one run directory, by path relative to it.

    Args:
        root: the run directory.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(os.path.realpath(root))

    def resolve(self, relative: str) -> Path:
        """The real path of ``relative`` inside the run directory.

        Raises:
            RefusedPathError: the path is malformed or leads outside the run directory.
        """
        parts = relative.split("/")
        if not relative or "\\" in relative or "\x00" in relative or any(p in ("", ".", "..") for p in parts):
            raise RefusedPathError(f"refused path {relative!r}: give a plain path relative to the run directory")
        real = Path(os.path.realpath(self.root.joinpath(*parts)))
        if not real.is_relative_to(self.root):
            raise RefusedPathError(f"refused path {relative!r}: it leads outside the run directory")
        return real

    @contextmanager
    def open(self, relative: str) -> Iterator[tuple[IO[bytes], int]]:
        """The regular file at ``relative``, opened for reading, and its size.

        Raises:
            RefusedPathError: see :meth:`resolve`; or it is not a regular file.
            FileNotFoundError: there is no such file.
        """
        path = self.resolve(relative)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise RefusedPathError(f"refused path {relative!r}: {exc.strerror}") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise RefusedPathError(f"refused path {relative!r}: not a regular file")
        with os.fdopen(fd, "rb") as file:
            yield file, info.st_size

    def exists(self, relative: str) -> bool:
        """Whether ``relative`` is a regular file inside the run directory."""
        try:
            return self.resolve(relative).is_file()
        except RefusedPathError:
            return False

    def read_text(self, relative: str, *, max_bytes: int) -> str | None:
        """The file's text (undecodable bytes replaced; at most ``max_bytes``, with a note when cut);
        None when it does not exist or is refused."""
        try:
            with self.open(relative) as (file, size):
                data = file.read(max_bytes)
        except (FileNotFoundError, RefusedPathError):
            return None
        text = data.decode("utf-8", errors="replace")
        return text if size <= max_bytes else f"{text}\n[... {size - max_bytes} more bytes: open the raw file ...]"

    def read_json(self, relative: str | None) -> Any:
        """The file's JSON document; None when there is no such file, it is refused or it is not JSON."""
        if not relative:
            return None
        try:
            with self.open(relative) as (file, _):
                return json.load(file)
        except (FileNotFoundError, RefusedPathError, ValueError):
            return None

    def listing(self, relative: str) -> list[dict[str, Any]]:
        """The regular files under the folder ``relative`` (path relative to the run directory, size),
        sorted; empty when it is not a folder inside the run directory."""
        try:
            folder = self.resolve(relative)
        except RefusedPathError:
            return []
        found = []
        for path in sorted(folder.rglob("*")) if folder.is_dir() else ():
            if path.is_file() and not path.is_symlink() and not path.name.startswith("."):
                found.append({"path": path.relative_to(self.root).as_posix(), "size": path.stat().st_size})
        return found


def content_type(relative: str) -> str | None:
    """The Content-Type a file is served with; None: served as a download (``application/octet-stream``)."""
    suffix = Path(relative).suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return "text/plain; charset=utf-8"
    return IMAGE_TYPES.get(suffix)
