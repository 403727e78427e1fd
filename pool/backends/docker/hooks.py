"""The known-good hooks that shared verification puts back (see :mod:`pool.backends.docker.verify`).

Per known-good snapshot, the loader, shell and Python hooks (:data:`pool.verification.SHARED_HOOKS`)
and the top-level links (``/bin``...) as its image has them, read once from a container of the
image that never starts and kept as one archive to unpack at ``/``.
"""

from __future__ import annotations

import posixpath
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any

from pool.backends.docker.transport import files
from pool.backends.docker.transport.engine import engine_errors
from pool.snapshots import Snapshot
from pool.verification import SHARED_HOOKS

TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Top-level paths put back as the known-good snapshot's links in shared mode (when they are links there)."""


class KnownGoodHooks:
    """Per known-good snapshot, an archive of its hooks (what shared mode puts back), made once."""

    def __init__(self, api: Any, folder: Path) -> None:
        self._api = api
        self.folder = folder
        """Where the archives are kept (removed when the backend closes)."""
        self._lock = threading.Lock()
        self._made: dict[str, HooksArchive] = {}

    def archive(self, snapshot: Snapshot) -> HooksArchive:
        """The hooks of ``snapshot``'s image (read from a container that never starts)."""
        with self._lock:
            if snapshot.digest not in self._made:
                self._made[snapshot.digest] = self._make(snapshot)
            return self._made[snapshot.digest]

    def _make(self, snapshot: Snapshot) -> HooksArchive:
        api = self._api
        with engine_errors("reading the known-good snapshot's hooks"):
            container = api.create_container(
                snapshot.digest, command=["true"], host_config=api.create_host_config(network_mode="none")
            )["Id"]
        top_links: list[str] = []
        dest = self.folder / f"hooks-{snapshot.digest.removeprefix('sha256:')[:32]}.tar"
        found = 0
        try:
            with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as out:
                for path in (*SHARED_HOOKS, *TOP_LINKS):
                    mode = files.mode_at(api, container, path)
                    if mode is None or (path in TOP_LINKS and not files.is_link(mode)):
                        continue
                    if path in TOP_LINKS:
                        top_links.append(path)
                    parent = posixpath.dirname(path).lstrip("/")
                    with files.get_archive(api, container, path) as response:
                        part = files.retar(response, files.prefixed(parent))
                    with part:
                        _append(out, part)
                    found += 1
        finally:
            with engine_errors("removing a container"):
                api.remove_container(container, force=True)
        return HooksArchive(dest if found else None, tuple(top_links))


class HooksArchive:
    """A known-good snapshot's hooks as one archive to unpack at ``/`` (None: it has none)."""

    def __init__(self, path: Path | None, top_links: tuple[str, ...]) -> None:
        self.path = path
        self.top_links = top_links


def new_hooks(api: Any) -> KnownGoodHooks:
    """A hooks cache in a fresh temporary folder (removed with the process's temp files)."""
    return KnownGoodHooks(api, Path(tempfile.mkdtemp(prefix="snapgym-docker-hooks-")))


def _append(out: tarfile.TarFile, archive: Any) -> None:
    with tarfile.open(fileobj=archive, mode="r|") as tar:
        for member in tar:
            out.addfile(member, tar.extractfile(member) if member.isfile() else None)
