"""C shared by the local backend's sandbox daemon and the Docker backend's helper.

One implementation of each piece both need: the verifier's link audit (``linkaudit.c``:
which symbolic links the agent left may lead the verifier into its private places) and
process trees through ``/proc`` (``proctree.c``: a command's processes, and killing them
all). Each build compiles these files with its own and hashes them into its version.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

FOLDER = Path(__file__).parent
"""The shared sources and headers; builds pass it as an include folder (``-I``)."""


def sources() -> list[Path]:
    """The shared ``.c`` and ``.h`` files, sorted."""
    return sorted(FOLDER.glob("*.[ch]"))


def hash_into(h: hashlib._Hash) -> None:
    """Add each shared file's name and content to ``h`` (a build's version covers them)."""
    for path in sources():
        h.update(path.name.encode() + b"\0" + path.read_bytes())


def find_compiler() -> str | None:
    """The C compiler both builds use: $CC, else cc, gcc or clang on PATH; None when there is none."""
    for name in [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]:
        found = shutil.which(name)
        if found:
            return found
    return None
