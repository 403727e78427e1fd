"""A layer blob's uncompressed tar as a stream, hashed as it is read.

The compression is told by the blob's first bytes, not by its media type
(``docker save`` archives and some registries label layers loosely): gzip is
read in-process, zstd through the ``zstd`` CLI, anything else as a plain tar
(bzip2 and xz too, for root filesystem tarballs; OCI layers do not use them).
:class:`Hashing` hashes the uncompressed bytes on the way, for the diff_id check.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import io
import lzma
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Protocol

from pool.errors import ImageError, UnsupportedError

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_BZIP2_MAGIC = b"BZh"
_XZ_MAGIC = b"\xfd7zXZ\x00"


class Readable(Protocol):
    """A byte stream to read from."""

    def read(self, size: int = ..., /) -> bytes: ...


class Hashing(io.RawIOBase):
    """A byte stream that hashes what is read through it."""

    def __init__(self, source: Readable) -> None:
        self.source = source
        self.sha = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.source.read(len(buffer))
        self.sha.update(data)
        buffer[: len(data)] = data
        return len(data)

    def digest(self) -> str:
        """``sha256:...`` of everything read so far."""
        return "sha256:" + self.sha.hexdigest()


@contextlib.contextmanager
def uncompressed(blob: Path, what: str) -> Iterator[Readable]:
    """The blob's tar, decompressed as its first bytes say; ``what`` names the blob in errors."""
    with open(blob, "rb") as raw:
        magic = raw.read(6)
        raw.seek(0)
        if magic.startswith(_GZIP_MAGIC):
            with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                yield unzipped
        elif magic.startswith(_ZSTD_MAGIC):
            with _zstd(blob, what) as unzstd:
                yield unzstd
        elif magic.startswith(_BZIP2_MAGIC):
            with bz2.BZ2File(raw, mode="rb") as unbzipped:
                yield unbzipped
        elif magic.startswith(_XZ_MAGIC):
            with lzma.LZMAFile(raw, mode="rb") as unxzed:
                yield unxzed
        else:
            yield raw


@contextlib.contextmanager
def _zstd(blob: Path, what: str) -> Iterator[IO[bytes]]:
    binary = shutil.which("zstd")
    if binary is None:
        raise UnsupportedError(f"{what} is zstd-compressed: install the zstd CLI (apt-get install zstd)")
    proc = subprocess.Popen([binary, "-dcq", "--", str(blob)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        yield proc.stdout
    finally:
        proc.stdout.close()
        message = proc.stderr.read().decode(errors="replace").strip()
        proc.stderr.close()
        code = proc.wait()
    if code != 0:
        raise ImageError(f"{what}: zstd could not decompress it ({message}); the blob is damaged: fetch it again")
