"""A minimal root filesystem tarball (a shell, ``true``, ``sleep``) plus a workspace.

Images cannot be pulled here, so the Docker baseline imports this tarball.
A statically linked busybox is used when the host has one
(``apt-get install busybox-static``); otherwise the host's ``sh``, ``true``
and ``sleep`` with the shared libraries ``ldd`` lists.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
_APPLETS = ("sh", "true", "sleep", "cat", "ls", "rm", "mkdir")
_HOST_TOOLS = ("sh", "true", "sleep")


def build(tarball: Path, workspace: Path, *, busybox: Path | None = BUSYBOX) -> str:
    """Write ``tarball`` holding the userland and ``workspace`` at ``/workspace``.

    Args:
        tarball: where to write the uncompressed tar.
        workspace: host directory copied to ``/workspace``.
        busybox: a busybox binary to use if it is statically linked; None
            forces the host-binaries fallback.

    Returns:
        Which userland went in: ``"busybox-static"`` or ``"host-binaries"``.
    """
    with tarfile.open(tarball, "w", dereference=True) as tar:
        for name, mode in (("tmp", 0o1777), ("proc", 0o755), ("dev", 0o755), ("sys", 0o755), ("etc", 0o755)):
            _add_dir(tar, name, mode)
        if busybox is not None and busybox.is_file() and _is_static(busybox):
            _add_busybox(tar, busybox)
            kind = "busybox-static"
        else:
            _add_host_tools(tar)
            kind = "host-binaries"
        tar.add(workspace, arcname="workspace")
    return kind


def _add_busybox(tar: tarfile.TarFile, busybox: Path) -> None:
    _add_dir(tar, "bin", 0o755)
    tar.add(busybox, arcname="bin/busybox")
    for applet in _APPLETS:
        link = tarfile.TarInfo(f"bin/{applet}")
        link.type, link.linkname = tarfile.SYMTYPE, "busybox"
        tar.addfile(link)


def _add_host_tools(tar: tarfile.TarFile) -> None:
    _add_dir(tar, "bin", 0o755)
    libraries: set[str] = set()
    for tool in _HOST_TOOLS:
        path = shutil.which(tool)
        if path is None:
            raise FileNotFoundError(f"no {tool!r} on the host PATH to put in the image")
        tar.add(path, arcname=f"bin/{tool}")
        libraries.update(_shared_libraries(path))
    for library in sorted(libraries):
        tar.add(library, arcname=library.lstrip("/"))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info, io.BytesIO())


def _is_static(binary: Path) -> bool:
    return not _shared_libraries(str(binary))


def _shared_libraries(binary: str) -> list[str]:
    """Absolute paths ``ldd`` resolves for ``binary`` (the loader included)."""
    done = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False)
    paths = []
    for line in done.stdout.splitlines():
        words = [w for w in line.replace("=>", " ").split() if w.startswith("/")]
        paths.extend(words[:1])
    return paths
