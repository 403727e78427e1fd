"""Build the sandbox daemon from its C source on first use, cached by hash.

The daemon is linked statically where a static C library is installed (Debian's ``libc6-dev``
has one; Fedora's is ``glibc-static``): its keepers and inits fork for every instance and
command, and a process with no shared libraries mapped forks, faults its pages in and exits with
less kernel work (measured in docs/results/cost.md). Without one it is linked dynamically, with a
warning: the same daemon, only dearer per episode.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import tempfile
from pathlib import Path

from pool.backends import csrc
from pool.errors import CompilerMissingError

SOURCE_DIR = Path(__file__).with_name("sandboxd")
"""The daemon's C: ``sandboxd.h`` and the plumbing at the top, one subfolder per process level below."""
_CFLAGS = ("-O2", "-Wall", "-Wno-format-truncation")
STATIC = "-static"
"""Tried first; dropped (with a warning) where the C library has no static archive."""
log = logging.getLogger(__name__)


def find_compiler() -> str:
    """The C compiler to use: $CC, else cc, gcc or clang on PATH."""
    found = csrc.find_compiler()
    if found is not None:
        return found
    raise CompilerMissingError(
        "the local backend builds a small C daemon on first use, but no C compiler was found; "
        "install one (Debian/Ubuntu: apt-get install gcc; Fedora: dnf install gcc) or set CC"
    )


def build_command(compiler: str, out: Path, *, static: bool = True) -> list[str]:
    """The compiler's command line: every ``.c`` under ``sandboxd/`` (subfolders too) and of the shared C.

    ``sandboxd.h`` sits at the top of ``sandboxd/``; the files in its subfolders find it through ``-I``.
    """
    sources = [*sorted(SOURCE_DIR.rglob("*.c")), *(p for p in csrc.sources() if p.suffix == ".c")]
    flags = [*_CFLAGS, STATIC] if static else list(_CFLAGS)
    return [compiler, *flags, f"-I{SOURCE_DIR}", f"-I{csrc.FOLDER}", "-o", str(out), *map(str, sources)]


def daemon_binary(cache_dir: Path) -> Path:
    """Path of the compiled daemon for the current source (its own and the shared C), compiling if needed.

    Raises:
        CompilerMissingError: no C compiler, or the source does not compile (no C library headers).
    """
    sources = sorted(SOURCE_DIR.rglob("*.[ch]"))
    h = hashlib.sha256(" ".join([*_CFLAGS, STATIC]).encode())
    for path in sources:
        # The path under sandboxd/, not the bare name: a file moved between subfolders is a new build.
        h.update(path.relative_to(SOURCE_DIR).as_posix().encode() + b"\0" + path.read_bytes())
    csrc.hash_into(h)
    tag = h.hexdigest()[:16]
    target = cache_dir / "bin" / f"snapgym-sandboxd-{tag}"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    compiler = find_compiler()
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / "sandboxd"
        proc = subprocess.run(build_command(compiler, out), capture_output=True, text=True)
        if proc.returncode != 0:
            proc = subprocess.run(build_command(compiler, out, static=False), capture_output=True, text=True)
            if proc.returncode == 0:
                log.warning(
                    "the sandbox daemon is linked dynamically: %s found no static C library (Debian/Ubuntu: "
                    "apt-get install libc6-dev; Fedora: dnf install glibc-static). It works the same; its "
                    "processes cost more CPU per episode. Delete %s to build it again after installing one.",
                    compiler,
                    target,
                )
        if proc.returncode != 0:
            raise CompilerMissingError(
                f"compiling the sandbox daemon with {compiler} failed "
                f"(are the C library headers installed? Debian: apt-get install libc6-dev):\n{proc.stderr[-2000:]}"
            )
        os.replace(out, target)
    return target
