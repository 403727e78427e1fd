"""Setup steps that place host files in a template, so file content is part of its hash.

A template's setup is a list of shell commands. Copying build-context files
(Dockerfile ``COPY``, an ``environment/`` folder) becomes commands that decode
base64 into place, chunked below the sandbox's command size limit.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Iterator

_CHUNK_BYTES = 64 * 1024


def write_file_steps(path: str, data: bytes, *, mode: int = 0o644) -> Iterator[str]:
    """Shell commands that create ``path`` (and its parents) with ``data`` and ``mode``."""
    quoted = shlex.quote(path)
    parent = shlex.quote(path.rsplit("/", 1)[0] or "/")
    first = True
    for start in range(0, max(len(data), 1), _CHUNK_BYTES):
        chunk = base64.b64encode(data[start : start + _CHUNK_BYTES]).decode() or "''"
        redirect = ">" if first else ">>"
        prefix = f"mkdir -p {parent} && " if first else ""
        yield f"{prefix}printf %s {chunk} | base64 -d {redirect} {quoted}"
        first = False
    yield f"chmod {mode & 0o7777:o} {quoted}"


def mkdir_step(path: str) -> str:
    """A shell command that creates a directory and its parents."""
    return f"mkdir -p {shlex.quote(path)}"
