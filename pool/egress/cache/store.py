"""The cache's files: response bodies by content, and an index of requests that names them.

Layout of a store folder::

    blobs/sha256/<hex>     a response body, named by its SHA-256 (many entries may share one)
    index/<key hex>.json   an :class:`Entry`: the request's key, the response's status and headers,
                           the body's digest and size, when it was recorded
    ca/                    the store's CA (:mod:`pool.egress.cache.authority`)
    tmp/                   bodies being written (renamed into blobs/ once whole)

Every file appears whole or not at all (written aside, then renamed), a blob before the index
entry that names it. A blob is checked against its name before it is served (:meth:`CacheStore.verify`):
a changed or truncated body is never given to a sandbox.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pool.egress.cache.key import RequestKey

FORMAT = 1
"""The index entries' format version."""
_READ_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored response."""

    key: RequestKey
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    """The response's headers as the origin sent them (names in its case), less hop-by-hop ones."""
    body_sha256: str
    body_size: int
    recorded_at: float
    """Unix time."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the index file's content)."""
        return {
            "format": FORMAT,
            "key": self.key.digest,
            "request": {**self.key.as_dict(), "url": self.key.url},
            "response": {"status": self.status, "reason": self.reason, "headers": [list(h) for h in self.headers]},
            "body": {"sha256": self.body_sha256, "size": self.body_size},
            "recorded_at": self.recorded_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        """The entry an index file holds.

        Raises:
            ValueError: the data is not an index entry of this format.
        """
        try:
            if data["format"] != FORMAT:
                raise ValueError(f"index entry format {data['format']!r}, expected {FORMAT}")
            request, response, body = data["request"], data["response"], data["body"]
            key = RequestKey(
                method=str(request["method"]),
                scheme=str(request["scheme"]),
                host=str(request["host"]),
                port=int(request["port"]),
                target=str(request["target"]),
                body_sha256=None if request["body_sha256"] is None else str(request["body_sha256"]),
                headers=tuple((str(n), str(v)) for n, v in request["headers"]),
            )
            if not 200 <= int(response["status"]) <= 599:
                raise ValueError(f"index entry status {response['status']!r} is not a final HTTP status")
            return cls(
                key=key,
                status=int(response["status"]),
                reason=str(response["reason"]),
                headers=tuple((str(n), str(v)) for n, v in response["headers"]),
                body_sha256=_hex_digest(body["sha256"]),
                body_size=int(body["size"]),
                recorded_at=float(data["recorded_at"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not an index entry: {type(exc).__name__} {exc}") from None


class BlobWriter:
    """A response body on its way into the store: hashed as written, dropped once over the cap."""

    def __init__(self, store: CacheStore, max_bytes: int) -> None:
        self._store = store
        self._max_bytes = max_bytes
        fd, name = tempfile.mkstemp(dir=store.tmp_dir, prefix="body-")
        self._path: Path | None = Path(name)
        self._file: IO[bytes] | None = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self.size = 0

    @property
    def is_kept(self) -> bool:
        """False once the body went over the cap (or was discarded)."""
        return self._file is not None

    def write(self, data: bytes) -> None:
        """Add ``data`` (nothing once over the cap)."""
        if self._file is None:
            return
        if self.size + len(data) > self._max_bytes:
            self.discard()
            return
        self._file.write(data)
        self._hash.update(data)
        self.size += len(data)

    def commit(self) -> str:
        """Move the whole body into ``blobs/`` under its digest; returns the digest.

        Raises:
            ValueError: it was discarded (over the cap).
        """
        if self._file is None or self._path is None:
            raise ValueError("the body was not kept")
        self._file.close()
        self._file = None
        digest = self._hash.hexdigest()
        os.replace(self._path, self._store.blob_path(digest))
        self._path = None
        return digest

    def discard(self) -> None:
        """Drop what was written. Idempotent."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._path.unlink()
            self._path = None


class CacheStore:
    """A store folder (see the module docstring); made on first use."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.index_dir = self.folder / "index"
        self.blobs_dir = self.folder / "blobs" / "sha256"
        self.tmp_dir = self.folder / "tmp"
        for path in (self.index_dir, self.blobs_dir, self.tmp_dir):
            path.mkdir(parents=True, exist_ok=True)

    def blob_path(self, digest: str) -> Path:
        """Where the body with this SHA-256 lies."""
        return self.blobs_dir / _hex_digest(digest)

    def index_path(self, key: RequestKey) -> Path:
        """Where the entry for ``key`` lies."""
        return self.index_dir / f"{key.digest}.json"

    def lookup(self, key: RequestKey) -> Entry | None:
        """The entry stored for ``key``, or None (an unreadable entry counts as none)."""
        try:
            entry = Entry.from_dict(json.loads(self.index_path(key).read_text()))
        except (OSError, ValueError):
            return None
        return entry if entry.key == key else None

    def writer(self, max_bytes: int) -> BlobWriter:
        """A new body being written."""
        return BlobWriter(self, max_bytes)

    def put(self, key: RequestKey, status: int, reason: str, headers: list[tuple[str, str]], body: BlobWriter) -> Entry:
        """Store a whole response: its body (moved into ``blobs/``), then its index entry."""
        size = body.size
        digest = body.commit()
        entry = Entry(key, status, reason, tuple(headers), digest, size, time.time())
        write_atomically(self.index_path(key), json.dumps(entry.as_dict(), indent=1).encode(), self.tmp_dir)
        return entry

    def verify(self, entry: Entry) -> bool:
        """Whether the entry's blob is there and its content matches its digest and size (reads it all)."""
        return blob_matches(self.blob_path(entry.body_sha256), entry.body_sha256, entry.body_size)

    def open_body(self, entry: Entry) -> IO[bytes]:
        """The entry's body, for reading."""
        return self.blob_path(entry.body_sha256).open("rb")


def blob_matches(path: Path, digest: str, size: int | None = None) -> bool:
    """Whether the file at ``path`` exists and has this SHA-256 (and size, when given)."""
    hasher, count = hashlib.sha256(), 0
    try:
        with path.open("rb") as file:
            while data := file.read(_READ_BYTES):
                hasher.update(data)
                count += len(data)
    except OSError:
        return False
    return hasher.hexdigest() == digest and (size is None or count == size)


def write_atomically(path: Path, data: bytes, tmp_dir: Path, mode: int = 0o600) -> None:
    """Write ``data`` aside in ``tmp_dir`` (same filesystem), then rename it to ``path``."""
    fd, name = tempfile.mkstemp(dir=tmp_dir, prefix=path.name + ".")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.chmod(name, mode)
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
        raise


def _hex_digest(value: Any) -> str:
    text = str(value)
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(f"not a SHA-256 hex digest: {text[:80]!r}")
    return text
