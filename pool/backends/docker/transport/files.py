"""Files in and out of a container through the engine's archive API (binary-safe, no process needed).

Reading asks for the path's archive and looks at the stat the engine sends
first: a link is followed (to the target the engine resolved, at most 40
times) or refused with ``follow_symlinks=False``, a folder or anything but a
regular file is refused before its content is read, and so is a file larger
than ``max_bytes``. Writing sends a one-file archive to the parent folder
(created through the helper when it is missing); the engine refuses to put a
file where a folder is. Errors are :class:`~pool.errors.FileOperationError`
with the errno the local backend would give.

The archive API sees the container's root filesystem and volumes, not its
tmpfs mounts (``/dev/shm``) or ``/proc``.
"""

from __future__ import annotations

import base64
import errno
import io
import json
import os
import posixpath
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from pool.backends.docker.transport.engine import translate
from pool.backends.docker.transport.execution import run_helper
from pool.errors import FileOperationError, SandboxCrashedError

_MODE_DIR = 1 << 31
_MODE_SYMLINK = 1 << 27
_MODE_NOT_REGULAR = (1 << 31) | (1 << 27) | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)
"""Go's os.FileMode type bits: dir, symlink, device, named pipe, socket, char device, irregular."""
_MAX_HOPS = 40


def read(api: Any, container: str, path: str, *, max_bytes: int | None, follow_symlinks: bool) -> bytes:
    """The bytes of a regular file in the container.

    Raises:
        FileOperationError: ENOENT, EISDIR, EINVAL (not a regular file), ELOOP (a link,
            with ``follow_symlinks=False``, or too many), EFBIG (over ``max_bytes``).
        SandboxCrashedError: the container is gone.
    """
    for _ in range(_MAX_HOPS):
        found = stat(api, container, path)
        mode = int(found.get("mode", 0))
        if mode & _MODE_SYMLINK:
            if not follow_symlinks:
                raise _error(errno.ELOOP, path, "it is a symbolic link")
            path = str(found.get("linkTarget") or "")
            if not path.startswith("/"):
                raise _error(errno.ENOENT, path, "a dangling link")
            continue
        if mode & _MODE_DIR:
            raise _error(errno.EISDIR, path)
        if mode & _MODE_NOT_REGULAR:
            raise _error(errno.EINVAL, path, "not a regular file")
        if max_bytes is not None and int(found.get("size", 0)) > max_bytes:
            raise _error(errno.EFBIG, path, f"larger than max_bytes={max_bytes}")
        with get_archive(api, container, path) as response:
            return _only_member(response, path, max_bytes)
    raise _error(errno.ELOOP, path, "too many levels of symbolic links")


def write(api: Any, container: str, path: str, data: bytes, *, mode: int | None) -> None:
    """Write a file in the container, creating its parent folders.

    Raises:
        FileOperationError: EISDIR (a folder is there), EROFS, or EIO with the engine's words.
        SandboxCrashedError: the container is gone.
    """
    parent, name = posixpath.split(path)
    if not name:
        raise _error(errno.EISDIR, path)
    archive = _one_file(name, data, 0o644 if mode is None else mode)
    for attempt in range(2):
        try:
            put_archive(api, container, parent, archive, shown=path)
            return
        except FileOperationError as exc:
            if exc.errno != errno.ENOENT or attempt:
                raise
        code, _, err = run_helper(api, container, ["mkdirs", parent])
        if code != 0:
            raise _error(errno.ENOTDIR, path, err.decode(errors="replace").strip())


def stat(api: Any, container: str, path: str) -> dict[str, Any]:
    """What is at ``path`` (never following a final link): name, size, mode (Go's FileMode bits), linkTarget.

    Raises:
        FileOperationError: ENOENT when there is nothing at ``path``.
        SandboxCrashedError: the container is gone.
    """
    try:
        response = api.head(api._url("/containers/{0}/archive", container), params={"path": path}, timeout=api.timeout)
        api._raise_for_status(response)
    except Exception as exc:
        raise _translate(exc, path, "read") from None
    header = response.headers.get("X-Docker-Container-Path-Stat", "")
    try:
        found: dict[str, Any] = json.loads(base64.b64decode(header)) if header else {}
    except ValueError:
        found = {}
    return found


def mode_at(api: Any, container: str, path: str) -> int | None:
    """The mode bits at ``path`` (a final link not followed), None when nothing is there."""
    try:
        return int(stat(api, container, path).get("mode", 0))
    except FileOperationError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise


def is_folder(mode: int) -> bool:
    """Whether a stat's mode is a folder's."""
    return bool(mode & _MODE_DIR)


def is_link(mode: int) -> bool:
    """Whether a stat's mode is a symbolic link's."""
    return bool(mode & _MODE_SYMLINK)


def get_archive(api: Any, container: str, path: str) -> Any:
    """The engine's streamed response holding ``path``'s archive (a final link is archived as a link).
    Read it to the end, then close it: the engine holds the container's mounts while it streams.

    Raises:
        FileOperationError: ENOENT when there is nothing at ``path``.
        SandboxCrashedError: the container is gone.
    """
    url = api._url("/containers/{0}/archive", container)
    try:
        response = api._get(url, params={"path": path}, stream=True)
        api._raise_for_status(response)
    except Exception as exc:
        raise _translate(exc, path, "read") from None
    return response


def put_archive(api: Any, container: str, folder: str, archive: Any, *, shown: str | None = None) -> None:
    """Unpack an archive (bytes, a file, or an iterator of chunks) into ``folder``, never putting a file
    where a folder is (``shown``: the path errors name, default the folder).

    Raises:
        FileOperationError: the folder is missing (ENOENT), read-only, or the engine refused.
        SandboxCrashedError: the container is gone.
    """
    url = api._url("/containers/{0}/archive", container)
    try:
        response = api._put(url, params={"path": folder, "noOverwriteDirNonDir": "true"}, data=archive)
        api._raise_for_status(response)
    except Exception as exc:
        raise _translate(exc, shown or folder, "write") from None


def _only_member(response: Any, path: str, max_bytes: int | None) -> bytes:
    data: bytes | None = None
    with tarfile.open(fileobj=RawStream(response.iter_content(1 << 16)), mode="r|") as tar:
        for member in tar:  # read to the end: the engine streams the whole archive
            extracted = tar.extractfile(member) if member.isfile() and data is None else None
            if extracted is not None:
                data = extracted.read()
    if data is None:
        raise _error(errno.EINVAL, path, "not a regular file")
    if max_bytes is not None and len(data) > max_bytes:  # it grew since the stat
        raise _error(errno.EFBIG, path, f"larger than max_bytes={max_bytes}")
    return data


def _one_file(name: str, data: bytes, mode: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode & 0o7777, int(time.time())
        info.uid = info.gid = 0
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _translate(exc: Exception, path: str, verb: str) -> Exception:
    code = getattr(exc, "status_code", None)
    text = str(getattr(exc, "explanation", None) or exc)
    if "No such container" in text:
        return SandboxCrashedError(f"the sandbox's container is gone ({text}); create a new sandbox")
    if code == 404:
        return _error(errno.ENOENT, path)
    if code is None:
        return translate(exc, f"{verb} {path}")
    lowered = text.lower()
    if "cannot overwrite directory" in lowered:
        return _error(errno.EISDIR, path)
    if "read-only" in lowered:
        return _error(errno.EROFS, path)
    if "not a directory" in lowered:
        return _error(errno.ENOTDIR, path)
    return _error(errno.EIO, path, f"the engine could not {verb} it: {text}")


def _error(code: int, path: str, detail: str | None = None) -> FileOperationError:
    why = f"{os.strerror(code)} ({detail})" if detail else os.strerror(code)
    return FileOperationError(code, f"{path} in the sandbox: {why}", path)


class RawStream(io.RawIOBase):
    """A file over an iterator of byte chunks (the archive as it arrives)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(target), len(self._rest))
        target[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n


def retar(response: Any, rename: Callable[[str], str], *, mode: int | None = None) -> Any:
    """The archive in an engine response, its member names passed through ``rename`` (and modes set to
    ``mode`` when given), as a file positioned at its start (spooled to disk when large)."""
    out_file = tempfile.SpooledTemporaryFile(max_size=16 << 20)  # noqa: SIM115 (returned open, the caller closes it)
    raw = io.BufferedReader(RawStream(response.iter_content(1 << 16)))
    with (
        tarfile.open(fileobj=raw, mode="r|") as tar,
        tarfile.open(fileobj=out_file, mode="w", format=tarfile.PAX_FORMAT) as out,
    ):
        for member in tar:
            member.name = rename(member.name)
            if mode is not None:
                member.mode = mode
            out.addfile(member, tar.extractfile(member) if member.isfile() else None)
    out_file.seek(0)
    return out_file


def prefixed(parent: str) -> Callable[[str], str]:
    """A renamer for :func:`retar`: every member moves under ``parent`` (relative; "" keeps it)."""

    def rename(name: str) -> str:
        return f"{parent}/{name}" if parent else name

    return rename


def top_renamed(top: str) -> Callable[[str], str]:
    """A renamer for :func:`retar`: the archive's top entry is called ``top``, the rest follows it."""

    def rename(name: str) -> str:
        _, sep, rest = name.partition("/")
        return f"{top}{sep}{rest}"

    return rename
