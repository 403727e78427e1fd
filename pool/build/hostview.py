"""The ``host`` base: a read-only view of the host userland, and nothing more.

Backend-neutral: the local backend binds these paths into its namespaces, the
Docker backend into its containers.

The sandbox sees the host's /usr (and /bin, /lib*, /sbin where they are real
directories), the running Python interpreter's prefix, and a minimal /etc
written here. It never sees /root, /home, the host's /proc, /tmp, /run (Docker
socket, Ray session), /var, or the host environment.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

_USERLAND = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_ETC_COPIED = (
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "nsswitch.conf",
    "resolv.conf",
    "localtime",
    "timezone",
    "os-release",
    "debian_version",
    "lsb-release",
    "profile",
    "profile.d",
    "bash.bashrc",
    "inputrc",
    "mime.types",
    "protocols",
    "services",
    "shells",
    "python3",
    f"python{sys.version_info.major}.{sys.version_info.minor}",
    "gitconfig",
    "magic",
    "login.defs",
)
_EMPTY_DIRS = (
    "proc",
    "dev",
    "sys",
    "tmp",
    "root",
    "home",
    "run",
    "var/tmp",
    "var/log",
    "var/cache",
    "var/lib",
    "opt",
    "mnt",
    "srv",
    "etc",
)
_PASSWD = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"
_HOSTS = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True, slots=True)
class HostView:
    """What the host base binds into a sandbox, and how the sandbox finds it."""

    binds: tuple[tuple[str, str], ...]
    """(host path, sandbox path) pairs, mounted read-only."""
    symlinks: tuple[tuple[str, str], ...]
    """(sandbox path, target) pairs for merged-/usr layouts."""
    python_prefix: str | None
    """The interpreter prefix bound at its own path when it is outside /usr."""

    @property
    def path_env(self) -> str:
        """PATH for execs: the host interpreter first, then the usual dirs."""
        if self.python_prefix:
            return f"{self.python_prefix}/bin:{DEFAULT_PATH}"
        return DEFAULT_PATH


def discover() -> HostView:
    """Inspect this host's layout."""
    binds: list[tuple[str, str]] = []
    symlinks: list[tuple[str, str]] = []
    for name in _USERLAND:
        host = Path("/") / name
        if host.is_symlink():
            symlinks.append((f"/{name}", os.readlink(host)))
        elif host.is_dir():
            binds.append((str(host), f"/{name}"))
    prefix = os.path.realpath(sys.base_prefix)
    python_prefix = None
    if not any(prefix == b or prefix.startswith(b + "/") for b, _ in binds) and prefix != "/":
        python_prefix = prefix
        binds.append((prefix, prefix))
    return HostView(tuple(binds), tuple(symlinks), python_prefix)


def write_skeleton(view: HostView, dest: Path) -> None:
    """Fill ``dest`` with the base layer: mount points, links, a minimal /etc."""
    for d in _EMPTY_DIRS:
        (dest / d).mkdir(parents=True, exist_ok=True)
    os.chmod(dest / "tmp", 0o1777)
    os.chmod(dest / "var" / "tmp", 0o1777)
    os.chmod(dest / "root", 0o700)
    for _, inside in view.binds:
        (dest / inside.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for inside, target in view.symlinks:
        os.symlink(target, dest / inside.lstrip("/"))
    etc = dest / "etc"
    for name in _ETC_COPIED:
        _copy_etc_entry(Path("/etc") / name, etc / name)
    (etc / "passwd").write_text(_PASSWD)
    (etc / "group").write_text(_GROUP)
    (etc / "hosts").write_text(_HOSTS)
    (etc / "hostname").write_text("sandbox\n")


def _copy_etc_entry(src: Path, dst: Path) -> None:
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        # /etc/ssl/private holds host keys: never copied. Unreadable entries are skipped.
        with contextlib.suppress(shutil.Error):
            shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("private"))
    elif src.is_file() and os.access(src, os.R_OK):
        shutil.copy2(src, dst)


def fingerprint(view: HostView) -> str:
    """A cheap identity of the host userland: packages, OS release, interpreter.

    Hashing all of /usr would take seconds; the package database and the
    interpreter version change whenever the userland does.
    """
    h = hashlib.sha256()
    h.update(repr(view).encode())
    h.update(sys.version.encode())
    for marker in (
        "/var/lib/dpkg/status",
        "/var/lib/rpm/rpmdb.sqlite",
        "/lib/apk/db/installed",
        "/etc/os-release",
        "/usr/lib/os-release",
    ):
        try:
            h.update(hashlib.sha256(Path(marker).read_bytes()).digest())
        except OSError:
            continue
    if view.python_prefix:
        site = Path(view.python_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
        try:
            listing = sorted(os.listdir(site / "site-packages"))
        except OSError:
            listing = []
        h.update("\n".join(listing).encode())
    return h.hexdigest()
