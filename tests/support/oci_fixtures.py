"""Real image infrastructure for the OCI image tests: Debian's registry, a test CA, images from Debian packages.

Test modules load this with ``pytest_plugins = ["tests.support.oci_fixtures"]``. Nothing here
reaches the internet except the Debian package mirror (for ``mmdebstrap``):
registries run on 127.0.0.1 (``/usr/bin/docker-registry``, the CNCF
distribution registry), images are assembled with ``umoci`` and pushed with
``skopeo``. The Debian root filesystem tarball is cached under
/var/cache/snapgym-tests, keyed by the mmdebstrap arguments, so reruns skip
the ~40 s build. Every registry process is stopped when the session ends.
It has no asserts of its own (PYTEST_DONT_REWRITE).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import socket
import ssl
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.needs import skip_missing

TOOLS = ("skopeo", "umoci", "docker-registry", "openssl")
CACHE_DIR = Path("/var/cache/snapgym-tests")
DEBIAN_MIRROR = "http://deb.debian.org/debian"
MMDEBSTRAP_ARGS = ("--variant=minbase", "--format=tar", "bookworm")
USER = "alice"
PASSWORD = "correct-horse-battery"  # a test registry's password; only ever in auth files


def missing_tools() -> list[str]:
    """The command-line tools these fixtures need that are not installed."""
    return [tool for tool in TOOLS if shutil.which(tool) is None]


# -- registries -----------------------------------------------------------------


@dataclass
class Registry:
    """A docker-registry process on 127.0.0.1."""

    host: str
    """``127.0.0.1:PORT``."""
    storage: Path
    process: subprocess.Popen[bytes]
    ca_dir: Path | None = None
    """For a TLS registry: the folder holding its CA certificate (``ca.crt``)."""

    def blob_file(self, digest: str) -> Path:
        """Where the registry keeps a blob on disk."""
        hex_ = digest.removeprefix("sha256:")
        return self.storage / "docker/registry/v2/blobs/sha256" / hex_[:2] / hex_ / "data"

    def stop(self) -> None:
        """Stop the process (idempotent)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_registry(
    folder: Path, *, tls: tuple[Path, Path, Path] | None = None, htpasswd: Path | None = None
) -> Registry:
    """Start a registry storing under ``folder``; ``tls`` is (CA folder, certificate, key)."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config: dict[str, object] = {
        "version": 0.1,
        "log": {"level": "error", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(folder / "data")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "snapgym-test"},
    }
    if tls is not None:
        config["http"] = {**config["http"], "tls": {"certificate": str(tls[1]), "key": str(tls[2])}}  # type: ignore[dict-item]
    if htpasswd is not None:
        config["auth"] = {"htpasswd": {"realm": "snapgym-test", "path": str(htpasswd)}}
    (folder / "config.yml").write_text(json.dumps(config))  # JSON is YAML
    log = open(folder / "registry.log", "wb")  # noqa: SIM115 (the process writes it until the session ends)
    process = subprocess.Popen(
        ["docker-registry", "serve", str(folder / "config.yml")], stdout=log, stderr=subprocess.STDOUT
    )
    log.close()
    registry = Registry(f"127.0.0.1:{port}", folder / "data", process, tls[0] if tls else None)
    _wait_ready(registry, folder / "registry.log")
    return registry


def _wait_ready(registry: Registry, log: Path) -> None:
    scheme = "https" if registry.ca_dir else "http"
    context = ssl.create_default_context(cafile=str(registry.ca_dir / "ca.crt")) if registry.ca_dir else None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if registry.process.poll() is not None:
            break
        try:
            urllib.request.urlopen(f"{scheme}://{registry.host}/v2/", timeout=1, context=context).close()
            return
        except urllib.error.HTTPError:
            return  # 401: up, and asking for credentials
        except OSError:
            time.sleep(0.05)
    registry.stop()
    raise RuntimeError(f"docker-registry did not start: {log.read_text()[-2000:]}")


def make_ca(folder: Path) -> tuple[Path, Path, Path]:
    """A test CA and a server certificate for 127.0.0.1 signed by it: (CA folder, cert, key)."""
    ca_dir = folder / "ca"
    ca_dir.mkdir(parents=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _run("openssl", "req", "-x509", *ec, "-keyout", folder / "ca.key", "-out", ca_dir / "ca.crt", "-days", "2",
         "-subj", "/CN=snapgym test CA", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    _run(
        "openssl", "req", *ec, "-keyout", folder / "server.key", "-out", folder / "server.csr", "-subj", "/CN=127.0.0.1"
    )
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _run("openssl", "x509", "-req", "-in", folder / "server.csr", "-CA", ca_dir / "ca.crt", "-CAkey", folder / "ca.key",
         "-CAcreateserial", "-out", folder / "server.crt", "-days", "2", "-extfile", folder / "ext.cnf")  # fmt: skip
    return ca_dir, folder / "server.crt", folder / "server.key"


def make_htpasswd(path: Path, user: str, password: str) -> Path:
    """An htpasswd file with one bcrypt entry (the registry accepts bcrypt only)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import crypt
        except ImportError:
            skip_missing("no crypt module (Python 3.13+) to make a bcrypt htpasswd entry")
        hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))  # cheap: a test
    if not hashed or not hashed.startswith("$2"):
        skip_missing("this libc's crypt() cannot make bcrypt hashes")
    path.write_text(f"{user}:{hashed}\n")
    return path


def auth_file(path: Path, host: str, user: str, password: str) -> Path:
    """A Docker config.json / containers-auth.json with credentials for ``host``."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {host: {"auth": token}}}))
    path.chmod(0o600)
    return path


# -- images ---------------------------------------------------------------------


@dataclass
class Layout:
    """An OCI layout built with umoci, whose tags are images."""

    path: Path

    def ref(self, tag: str) -> str:
        """The skopeo name of a tag (``oci:PATH:TAG``)."""
        return f"oci:{self.path}:{tag}"

    def manifest_digest(self, tag: str) -> str:
        """The digest of the manifest a tag names."""
        for entry in json.loads((self.path / "index.json").read_text())["manifests"]:
            if entry.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
                return str(entry["digest"])
        raise KeyError(tag)

    def layer_digests(self, tag: str) -> list[str]:
        """The digests of a tag's layer blobs, bottom first."""
        manifest = self.path / "blobs/sha256" / self.manifest_digest(tag).removeprefix("sha256:")
        return [layer["digest"] for layer in json.loads(manifest.read_text())["layers"]]


def umoci(*args: object) -> None:
    """Run umoci, failing with its message."""
    _run("umoci", *args)


def new_image(
    layout: Layout,
    tag: str,
    layer_tars: list[Path],
    *,
    base: str | None = None,
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    arch: str | None = None,
) -> None:
    """Tag ``tag``: ``base``'s layers (or none) plus ``layer_tars`` (uncompressed), with a config."""
    if not (layout.path / "index.json").exists():
        umoci("init", "--layout", layout.path)
    if base is None:
        umoci("new", "--image", f"{layout.path}:{tag}")
    else:
        umoci("tag", "--image", f"{layout.path}:{base}", tag)
    for tar in layer_tars:
        umoci("raw", "add-layer", "--no-history", "--image", f"{layout.path}:{tag}", tar)
    config: list[object] = []
    for key, value in (env or {}).items():
        config += ["--config.env", f"{key}={value}"]
    if workdir:
        config += ["--config.workingdir", workdir]
    if arch:
        config += ["--architecture", arch]
    if config:
        umoci("config", "--no-history", "--image", f"{layout.path}:{tag}", *config)


@dataclass(frozen=True)
class Entry:
    """One member of a hand-made layer tar."""

    name: str
    data: bytes = b""
    kind: bytes = tarfile.REGTYPE
    mode: int = 0o644
    link: str = ""
    uid: int = 0
    gid: int = 0
    dev: tuple[int, int] = (0, 0)
    extra: dict[str, str] = field(default_factory=dict)


def write_tar(path: Path, entries: list[Entry]) -> Path:
    """An uncompressed tar of ``entries``, in order (PAX format, so long names are fine)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.type, info.mode, info.linkname = e.kind, e.mode, e.link
            info.uid, info.gid, info.mtime = e.uid, e.gid, 1_700_000_000
            info.devmajor, info.devminor = e.dev
            info.size = len(e.data) if e.kind == tarfile.REGTYPE else 0
            info.pax_headers = dict(e.extra)
            tar.addfile(info, io.BytesIO(e.data) if e.kind == tarfile.REGTYPE else None)
    return path


def push(source: str, registry: Registry, repo: str, *, authfile: Path | None = None, fmt: str | None = None) -> str:
    """Copy an image into a registry (``fmt``: ``v2s2`` for a Docker schema 2 manifest); its ``host/repo``."""
    dest = f"{registry.host}/{repo}"
    args = ["--dest-tls-verify=false"] if registry.ca_dir is None else [f"--dest-cert-dir={registry.ca_dir}"]
    if authfile is not None:
        args.append(f"--dest-authfile={authfile}")
    if fmt is not None:
        args.append(f"--format={fmt}")
    _run("skopeo", "--insecure-policy", "copy", "--quiet", *args, source, f"docker://{dest}")
    return dest


def tiny_image(folder: Path, name: str, *, arch: str | None = None) -> Layout:
    """A one-layer image of a few files unique to ``name`` (so its blobs are its own in a registry)."""
    layout = Layout(folder / f"layout-{name}")
    tar = write_tar(
        folder / f"{name}.tar",
        [
            Entry("etc/", kind=tarfile.DIRTYPE, mode=0o755),
            Entry("etc/tiny-release", f"{name}\n".encode()),
            Entry("data/", kind=tarfile.DIRTYPE, mode=0o755),
            Entry("data/blob.bin", hashlib.sha256(name.encode()).digest() * 4096),
        ],
    )
    new_image(layout, "latest", [tar], env={"TINY": name, "PATH": "/bin"}, workdir="/data", arch=arch)
    return layout


def whiteout_layer(path: Path) -> Path:
    """A layer over Debian that deletes, hides, links and keeps things (the overlayfs translation cases)."""
    return write_tar(
        path,
        [
            Entry("etc/", kind=tarfile.DIRTYPE, mode=0o755),
            Entry("etc/.wh.issue"),  # deletes /etc/issue of the Debian layer
            Entry("etc/snapgym-release", b"whiteouts\n"),
            Entry("usr/", kind=tarfile.DIRTYPE, mode=0o755),
            Entry("usr/share/", kind=tarfile.DIRTYPE, mode=0o755),
            Entry("usr/share/doc/", kind=tarfile.DIRTYPE, mode=0o755),
            Entry("usr/share/doc/.wh..wh..opq"),  # hides every doc folder below
            Entry("usr/share/doc/snapgym/", kind=tarfile.DIRTYPE, mode=0o755),
            Entry("usr/share/doc/snapgym/README", b"only me\n"),
            Entry("srv/", kind=tarfile.DIRTYPE, mode=0o755),
            Entry("srv/hard-a", b"linked\n", uid=1000, gid=1000),
            Entry("srv/hard-b", kind=tarfile.LNKTYPE, link="srv/hard-a", uid=1000, gid=1000),
            Entry("srv/suid", b"#!/bin/sh\n", mode=0o4755),
            Entry("srv/.wh.keep"),  # a whiteout for a name the layer also has: the layer's own entry wins
            Entry("srv/keep", b"kept\n"),
            Entry("srv/null", kind=tarfile.CHRTYPE, dev=(1, 3)),  # a device node: skipped
            Entry("srv/sparse", bytes(1 << 20) + b"end"),
        ],
    )


@dataclass
class DebianImages:
    """Images over a Debian bookworm root filesystem, in a local registry."""

    layout: Layout
    base: str
    """``host/test/debian:bookworm``: the root filesystem as one layer, Env and WorkingDir set."""
    whiteouts: str
    """``host/test/debian:whiteouts``: ``base`` plus :func:`whiteout_layer`."""
    sibling: str
    """``host/test/sibling:1``: ``base`` plus another small layer (shares the Debian layer)."""


def debian_rootfs() -> Path:
    """The mmdebstrap tarball of Debian bookworm (minbase), built once per machine and cached."""
    key = hashlib.sha256(json.dumps([*MMDEBSTRAP_ARGS, DEBIAN_MIRROR]).encode()).hexdigest()[:16]
    cache = _cache_dir()
    target = cache / f"mmdebstrap-bookworm-{key}.tar"
    with _locked(cache / f"{target.name}.lock"):
        if target.exists():
            return target
        partial = cache / f".{target.name}.{os.getpid()}"
        done = subprocess.run(
            ["mmdebstrap", "--quiet", *MMDEBSTRAP_ARGS, str(partial), DEBIAN_MIRROR], capture_output=True, text=True
        )
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            skip_missing(f"cannot build the Debian test image with mmdebstrap: {done.stderr.strip()[-1000:]}")
        os.replace(partial, target)
    return target


def debian_layout(rootfs: Path, scratch: Path) -> Layout:
    """An OCI layout of the Debian images, cached beside the tarball, keyed by it and the layers put on it."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SNAPGYM_IMAGE": "debian"}
    whiteouts = whiteout_layer(scratch / "wh.tar")
    sibling = write_tar(
        scratch / "sib.tar", [Entry("opt/", kind=tarfile.DIRTYPE, mode=0o755), Entry("opt/sibling", b"sibling\n")]
    )
    recipe = hashlib.sha256(json.dumps([rootfs.name, env]).encode())
    for tar in (whiteouts, sibling):
        recipe.update(tar.read_bytes())
    cache = _cache_dir()
    target = cache / f"oci-debian-{recipe.hexdigest()[:16]}"
    with _locked(cache / f"{target.name}.lock"):
        if not (target / "index.json").exists():
            layout = Layout(scratch / "layout")
            new_image(layout, "base", [rootfs], env=env, workdir="/srv")
            new_image(layout, "whiteouts", [whiteouts], base="base")
            new_image(layout, "sibling", [sibling], base="base")
            work = cache / f".{target.name}.{os.getpid()}"  # beside the target, so the last step is a rename
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(layout.path, work)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(work, target)
    return Layout(target)


# -- fixtures -------------------------------------------------------------------


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A plain-HTTP registry without authentication."""
    if missing := missing_tools():
        skip_missing(f"needs {', '.join(missing)}")
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def mirror_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A second plain-HTTP registry, used as a mirror."""
    if missing := missing_tools():
        skip_missing(f"needs {', '.join(missing)}")
    reg = start_registry(tmp_path_factory.mktemp("mirror"))
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A TLS registry (certificate from a test CA, see ``ca_dir``) that wants USER/PASSWORD."""
    if missing := missing_tools():
        skip_missing(f"needs {', '.join(missing)}")
    folder = tmp_path_factory.mktemp("auth-registry")
    htpasswd = make_htpasswd(folder / "htpasswd", USER, PASSWORD)
    reg = start_registry(folder / "registry", tls=make_ca(folder / "tls"), htpasswd=htpasswd)
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def debian_images(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> DebianImages:
    """The Debian images (built from Debian packages), pushed to ``registry``."""
    if shutil.which("mmdebstrap") is None:
        skip_missing("needs mmdebstrap")
    layout = debian_layout(debian_rootfs(), tmp_path_factory.mktemp("debian-layout"))
    return DebianImages(
        layout=layout,
        base=push(layout.ref("base"), registry, "test/debian:bookworm"),
        whiteouts=push(layout.ref("whiteouts"), registry, "test/debian:whiteouts"),
        sibling=push(layout.ref("sibling"), registry, "test/sibling:1"),
    )


# -- helpers --------------------------------------------------------------------


def _run(*args: object) -> None:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} failed ({done.returncode}): {' '.join(map(str, args))}\n{done.stderr[-2000:]}")


def _cache_dir() -> Path:
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        probe = CACHE_DIR / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
        return CACHE_DIR
    except OSError:
        fallback = Path(os.environ.get("TMPDIR", "/tmp")) / f"snapgym-tests-{os.getuid()}"
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield
