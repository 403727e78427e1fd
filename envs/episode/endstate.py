"""The digest of an episode's end state, so two runs of an episode can be shown to end alike.

The end state is the task's snapshot plus what the episode changed; its digest
hashes the snapshot's digest and, for every changed path in order, its kind
and payload: nothing for a removed path, ``dir`` for a directory, the SHA-256
of a regular file's bytes, and the reason a file could not be read as one
(a link, a FIFO) for anything else. The listing comes from the backend
(``sandbox.changes()``, read outside the sandbox where the backend can) and the
bytes through ``read_file`` without following links, so the agent cannot edit
either. Modes and owners are not part of it, nor a link's target: it proves
equal contents, not equal metadata.

There is no digest (None, with the reason) when the backend cannot list the
changes, when the listing was cut short, or when a changed file is larger
than :data:`MAX_FILE_BYTES`.
"""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Mapping
from typing import Any

from pool.changes import Changes
from pool.contract import Sandbox
from pool.errors import FileOperationError, SnapgymError

MAX_FILE_BYTES = 256 * 1024 * 1024
"""The largest changed file the digest reads (a larger one leaves the episode without a digest)."""


def end_digest(sandbox: Sandbox, changes: Mapping[str, Any], base_digest: str) -> tuple[str | None, str | None]:
    """``(digest, None)`` of the end state ``changes`` (``Changes.as_dict()``) describe over ``base_digest``,
    or ``(None, why not)``."""
    if "unavailable" in changes:
        return None, f"the changes are unavailable: {changes['unavailable']}"
    listed = Changes.from_dict(dict(changes))
    if listed.truncated:
        return None, "the list of changes was cut short (too many paths)"
    hasher = hashlib.sha256(b"snapgym-end-state-1\0" + base_digest.encode() + b"\0")
    entries = [(path, "removed") for path in listed.removed]
    entries += [(path, "present") for path in (*listed.added, *listed.changed)]
    for path, kind in sorted(entries):
        payload = b"" if kind == "removed" else _payload(sandbox, path)
        if payload is None:
            return None, f"{path} is over {MAX_FILE_BYTES} bytes"
        hasher.update(path.encode("utf-8", "surrogateescape") + b"\0" + kind.encode() + b"\0" + payload + b"\0")
    return hasher.hexdigest(), None


def _payload(sandbox: Sandbox, path: str) -> bytes | None:
    if path.endswith("/"):
        return b"dir"
    try:
        return hashlib.sha256(sandbox.read_file(path, max_bytes=MAX_FILE_BYTES, follow_symlinks=False)).digest()
    except FileOperationError as exc:
        if exc.errno == errno.EFBIG:
            return None
        return f"unreadable:{errno.errorcode.get(exc.errno or 0, exc.errno)}".encode()
    except SnapgymError as exc:
        return f"unreadable:{type(exc).__name__}".encode()
