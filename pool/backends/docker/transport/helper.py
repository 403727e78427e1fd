"""snapgym's helper program inside every container: built here, delivered as a read-only volume.

Why a helper at all: ``docker exec`` alone cannot keep the contract. A
command that started ``(setsid sleep 60 &)`` keeps the exec's output open and
outlives a timeout, and a background service holding stdout would make every
exec wait for it. The helper (``helper.c``) runs each command as a child
subreaper, so a timeout kills everything the command started, relays its
output capped, and ends the exec when the command ends. It is also the
container's PID 1 (which no process inside can kill) and the verifier's link
audit. Its process trees and its link audit are the C it shares with the local
backend's daemon (:mod:`pool.backends.csrc`), compiled in.

Why a volume: the helper must be in every container, whatever the image (a
static binary needs nothing from it), out of every snapshot (a commit does not
include volumes), and out of the agent's reach (mounted read-only; without
CAP_SYS_ADMIN it cannot be unmounted). The volume is named by the hash of the
source and filled once per engine by Docker itself (a new named volume takes
the content of the image path it is mounted over), so a remote engine works
too. Compiling needs a C compiler with a static C library on this machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import subprocess
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any

from pool.backends import csrc
from pool.backends.docker.transport.engine import engine_errors
from pool.errors import BackendError, CompilerMissingError

SOURCE = Path(__file__).with_name("helper.c")
MOUNT = "/.snapgym"
"""Where the volume appears in every container."""
PATH = f"{MOUNT}/helper"
"""The helper inside a container."""
_CFLAGS = ("-O2", "-static", "-s", "-Wall")
_LOCK = threading.Lock()


def tag() -> str:
    """The helper's version: a hash of its source, the shared C and the compiler flags."""
    h = hashlib.sha256(" ".join(_CFLAGS).encode())
    h.update(SOURCE.read_bytes())
    csrc.hash_into(h)
    return h.hexdigest()[:16]


def build_command(compiler: str, dest: Path) -> list[str]:
    """The compiler's command line: ``helper.c`` and every ``.c`` of the shared C."""
    shared = [str(p) for p in csrc.sources() if p.suffix == ".c"]
    return [compiler, *_CFLAGS, f"-I{csrc.FOLDER}", "-o", str(dest), str(SOURCE), *shared]


def compile_helper(dest: Path) -> None:
    """Compile the helper, statically linked, to ``dest``.

    Raises:
        CompilerMissingError: no C compiler, or no static C library.
    """
    compiler = csrc.find_compiler()
    if compiler is None:
        raise CompilerMissingError(
            "the docker backend compiles a small static helper for its containers on first use, but no C "
            "compiler was found; install one (Debian/Ubuntu: apt-get install gcc libc6-dev) or set CC"
        )
    proc = subprocess.run(build_command(compiler, dest), capture_output=True, text=True)
    if proc.returncode != 0:
        raise CompilerMissingError(
            f"compiling the docker backend's helper with {compiler} failed (a static C library is needed: "
            f"Debian/Ubuntu: apt-get install libc6-dev; Fedora: dnf install glibc-static):\n{proc.stderr[-2000:]}"
        )


def image_name(prefix: str) -> str:
    """The engine's image that holds this version of the helper (and fills new volumes)."""
    return f"{prefix}/helper:{tag()}"


def ensure_volume(client: Any, *, prefix: str) -> str:
    """The name of the engine's volume holding this version of the helper, made if missing.

    Raises:
        CompilerMissingError: the helper had to be compiled and could not be.
        BackendError: the engine refused to make the volume.
    """
    version = tag()
    name = f"{prefix.replace('/', '-')}-helper-{version}"
    image = image_name(prefix)
    with _LOCK, engine_errors("installing snapgym's helper in the Docker engine"):
        if _volume_holds_helper(client, name, image):
            return name
        _import_image(client, image)
        if not _volume_holds_helper(client, name, image):
            raise BackendError(
                f"the Docker volume {name} does not hold snapgym's helper; remove it (docker volume rm {name})"
            )
        _remove_older(client, name, image)
    return name


def _remove_older(client: Any, volume: str, image: str) -> None:
    """Remove the volumes and images of earlier helper versions of this prefix (those in use stay)."""
    api = client.api
    stem, repository = volume.rsplit("-", 1)[0] + "-", image.rsplit(":", 1)[0]
    for found in (api.volumes(filters={"name": stem}) or {}).get("Volumes") or ():
        if found["Name"].startswith(stem) and found["Name"] != volume:
            with contextlib.suppress(Exception):
                api.remove_volume(found["Name"])
    for found in api.images(name=repository):
        for tag in found.get("RepoTags") or ():
            if tag != image:
                with contextlib.suppress(Exception):
                    api.remove_image(tag)


def _volume_holds_helper(client: Any, volume: str, image: str) -> bool:
    """Mount the volume in a container that is never started (filling it from the image if it is new)."""
    docker = client.api
    try:
        client.images.get(image)
    except Exception:
        return False
    container = docker.create_container(
        image,
        command=[PATH, "init"],
        host_config=docker.create_host_config(binds={volume: {"bind": MOUNT, "mode": "ro"}}, network_mode="none"),
        labels={"snapgym.role": "helper-check"},
    )["Id"]
    try:
        response = docker.head(docker._url("/containers/{0}/archive", container), params={"path": PATH}, timeout=30)
        return response.status_code == 200 and bool(response.headers.get("X-Docker-Container-Path-Stat"))
    finally:
        docker.remove_container(container, force=True)


def _import_image(client: Any, image: str) -> None:
    repository, version = image.rsplit(":", 1)
    with tempfile.TemporaryDirectory(prefix="snapgym-helper-") as tmp:
        binary = Path(tmp) / "helper"
        compile_helper(binary)
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            folder = tarfile.TarInfo(MOUNT.lstrip("/"))
            folder.type, folder.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(folder)
            info = tar.gettarinfo(str(binary), arcname=PATH.lstrip("/"))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = 0o755
            with binary.open("rb") as f:
                tar.addfile(info, f)
        client.api.import_image_from_data(data.getvalue(), repository=repository, tag=version)
