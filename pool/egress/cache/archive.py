"""Moving a cache between machines: one tar of its index, the blobs the index names, and its CA.

``export`` writes what a store holds now (the tar appears whole or not at all). ``import``
unpacks into a staging folder inside the destination store (with tarfile's ``data`` filter,
and only the names a store has), checks every blob against its name and every index entry
against its own name and its blob, and only then moves them in: a damaged or doctored tar
adds nothing. The destination keeps its own CA when it has one.

The tar holds the CA's private key: handle it like the key (see :mod:`pool.egress.cache`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

from pool.egress.cache.authority import CA_CERT, CA_KEY
from pool.egress.cache.store import CacheStore, Entry, blob_matches
from pool.errors import ConfigError

_MEMBER = re.compile(r"(index/[0-9a-f]{64}\.json|blobs/sha256/[0-9a-f]{64}|ca/ca\.(pem|key))")
_FOLDERS = frozenset({"index", "blobs", "blobs/sha256", "ca"})


def export(folder: str | os.PathLike[str], out: str | os.PathLike[str]) -> int:
    """Write the store at ``folder`` to the tar ``out``; returns the number of index entries."""
    store = CacheStore(folder)
    out = Path(out)
    fd, name = tempfile.mkstemp(dir=out.parent, prefix=out.name + ".")
    os.close(fd)
    count = 0
    try:
        with tarfile.open(name, "w") as tar:
            for cert in (CA_CERT, CA_KEY):
                if (path := store.folder / "ca" / cert).exists():
                    tar.add(path, f"ca/{cert}")
            blobs: set[str] = set()
            for path in sorted(store.index_dir.glob("*.json")):
                try:
                    entry = Entry.from_dict(json.loads(path.read_text()))
                except (OSError, ValueError):
                    continue  # unreadable: it would not be served either
                if path.stem != entry.key.digest or not store.blob_path(entry.body_sha256).exists():
                    continue
                if entry.body_sha256 not in blobs:
                    tar.add(store.blob_path(entry.body_sha256), f"blobs/sha256/{entry.body_sha256}")
                    blobs.add(entry.body_sha256)
                tar.add(path, f"index/{path.name}")
                count += 1
        os.replace(name, out)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return count


def import_(archive: str | os.PathLike[str], folder: str | os.PathLike[str]) -> int:
    """Add the entries of the tar ``archive`` to the store at ``folder``; returns how many.

    Raises:
        ConfigError: the tar holds something a store does not, a blob whose content is not its
            name, or an index entry that is unreadable, misnamed, or names a blob it lacks.
    """
    store = CacheStore(folder)
    staging = Path(tempfile.mkdtemp(dir=store.tmp_dir, prefix="import-"))
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            for member in members:
                if not _expected(member):
                    raise ConfigError(f"cache import: {archive}: unexpected member {member.name!r}")
            tar.extractall(staging, members=members, filter="data")
        entries = _checked(staging, store)
        _move_in(staging, store, entries)
        return len(entries)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _expected(member: tarfile.TarInfo) -> bool:
    if member.isdir():
        return member.name in _FOLDERS
    return member.isfile() and _MEMBER.fullmatch(member.name) is not None


def _checked(staging: Path, store: CacheStore) -> list[Path]:
    for blob in sorted((staging / "blobs" / "sha256").glob("*")):
        if not blob_matches(blob, blob.name):
            raise ConfigError(f"cache import: blob {blob.name} does not match its content; nothing imported")
    entries = sorted((staging / "index").glob("*.json"))
    for path in entries:
        try:
            entry = Entry.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            why = f"cache import: index entry {path.name} is unreadable ({exc}); nothing imported"
            raise ConfigError(why) from None
        if path.stem != entry.key.digest:
            raise ConfigError(f"cache import: index entry {path.name} is not named by its key; nothing imported")
        staged = staging / "blobs" / "sha256" / entry.body_sha256
        if not staged.exists() and not blob_matches(store.blob_path(entry.body_sha256), entry.body_sha256):
            raise ConfigError(f"cache import: index entry {path.name} names a missing blob; nothing imported")
    return entries


def _move_in(staging: Path, store: CacheStore, entries: list[Path]) -> None:
    for blob in (staging / "blobs" / "sha256").glob("*"):
        os.replace(blob, store.blob_path(blob.name))  # blobs before the entries that name them
    for path in entries:
        os.replace(path, store.index_dir / path.name)
    ca = staging / "ca"
    if (ca / CA_KEY).exists() and (ca / CA_CERT).exists() and not (store.folder / "ca" / CA_KEY).exists():
        os.chmod(ca, 0o700)
        os.chmod(ca / CA_KEY, 0o600)
        os.replace(ca, store.folder / "ca")
