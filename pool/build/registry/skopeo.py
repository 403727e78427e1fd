"""Running the skopeo CLI with a private configuration made from RegistrySettings.

Each command gets a fresh 0700 folder holding everything skopeo reads: an auth
file (0600; passwords never appear on a command line, where other users could
see them), a registries.conf with the mirrors and plain-HTTP hosts, a merged
folder of CA certificates, a signature policy and an empty home, so nothing of
the host's container configuration leaks in. The folder is removed when the
command ends. A failing command becomes an ImageError (see :mod:`fetcherrors`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pool.build.registry.fetcherrors import explain
from pool.build.registry.settings import RegistrySettings
from pool.errors import ConfigError, RegistryUnreachableError, UnsupportedError

_PASSED_ENV = (
    "PATH",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "DOCKER_HOST",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)
_ACCEPT_ANY = {"default": [{"type": "insecureAcceptAnything"}]}
_CERT_SUFFIXES = (".crt", ".cert", ".key")


class Skopeo:
    """The skopeo CLI, configured only by ``settings``.

    Args:
        settings: credentials, mirrors, insecure hosts, CAs, platform, policy.
        tmp_dir: where skopeo keeps large temporary files (layers being copied).
    """

    def __init__(self, settings: RegistrySettings, *, tmp_dir: Path) -> None:
        binary = shutil.which("skopeo")
        if binary is None:
            raise UnsupportedError(
                "fetching images needs the skopeo CLI: install it (apt-get install skopeo, dnf install skopeo)"
            )
        self.binary = binary
        self.settings = settings
        self.tmp_dir = tmp_dir

    def copy(self, source: str, dest: str, *, image: str, host: str | None) -> None:
        """``skopeo copy source dest``, keeping uncompressed layers as they are (``host``: the source's registry).

        Raises:
            ImageError: the copy failed; the message says why and how to provide the image.
        """
        self._run("copy", ["--quiet", "--dest-oci-accept-uncompressed-layers", source, dest], image=image, host=host)

    def inspect_raw(self, name: str, *, image: str, host: str | None) -> bytes:
        """The raw manifest (or index) ``name`` resolves to, exactly as the registry serves it.

        Raises:
            ImageError: it could not be read.
        """
        return self._run("inspect", ["--raw", name], image=image, host=host)

    def inspect_config(self, name: str, *, image: str, host: str | None) -> bytes:
        """The image config document of ``name`` (for this platform, picked from an index).

        Raises:
            ImageError: it could not be read.
        """
        return self._run("inspect", ["--config", "--raw", name], image=image, host=host)

    def _run(self, command: str, args: list[str], *, image: str, host: str | None) -> bytes:
        prefix = "src-" if command == "copy" else ""  # inspect's options have no src- prefix
        with _private_dir() as private:
            source = self._source_args(private, prefix, registry=host is not None)
            argv = [self.binary, *self._global_args(private), command, *source, *args]
            try:
                done = subprocess.run(
                    argv,
                    env=_env(private, self.tmp_dir),
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=self.settings.timeout_s,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise RegistryUnreachableError(
                    f"image {image}: skopeo {command} did not finish within {self.settings.timeout_s:g}s; "
                    "the registry is slow or unreachable: raise RegistrySettings(timeout_s=...), configure a "
                    "mirror, or provide the image as a file (docker-archive:, oci:)"
                ) from None
        if done.returncode != 0:
            raise explain(done.stderr.decode(errors="replace"), image=image, host=host)
        return done.stdout

    def _global_args(self, private: Path) -> list[str]:
        settings = self.settings
        policy = settings.policy or _write_json(private / "policy.json", _ACCEPT_ANY)
        args = ["--registries-conf", str(_write_registries_conf(private / "registries.conf", settings))]
        args += ["--policy", str(policy), "--tmpdir", str(self.tmp_dir)]
        args += ["--override-os", settings.os, "--override-arch", settings.arch]
        if settings.variant:
            args += ["--override-variant", settings.variant]
        return args

    def _source_args(self, private: Path, prefix: str, *, registry: bool) -> list[str]:
        """The options of a copy's source (or of an inspect): credentials and certificates.

        A registry always gets a certificate folder of its own, so the host's certs.d folders are not read;
        a Docker engine keeps DOCKER_CERT_PATH unless CA folders are given.
        """
        args = [f"--{prefix}authfile={_write_json(private / 'auth.json', _auth_data(self.settings))}"]
        if registry or self.settings.ca_dirs:
            args.append(f"--{prefix}cert-dir={_merge_certs(private / 'certs', self.settings.ca_dirs)}")
        return args


@contextlib.contextmanager
def _private_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="snapgym-skopeo-") as folder:  # 0700
        path = Path(folder)
        for sub in ("home", "run", "config", "docker"):
            (path / sub).mkdir(mode=0o700)
        yield path


def _env(private: Path, tmp_dir: Path) -> dict[str, str]:
    env = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
    env.setdefault("PATH", os.defpath)
    env.update(
        HOME=str(private / "home"),
        XDG_RUNTIME_DIR=str(private / "run"),
        XDG_CONFIG_HOME=str(private / "config"),
        DOCKER_CONFIG=str(private / "docker"),
        TMPDIR=str(tmp_dir),
    )
    return env


def _auth_data(settings: RegistrySettings) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if settings.auth_file is not None:
        try:
            loaded = json.loads(settings.auth_file.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"RegistrySettings.auth_file {settings.auth_file} cannot be read: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"RegistrySettings.auth_file {settings.auth_file} is not a JSON object")
        data = loaded
    auths = data.get("auths")
    auths = dict(auths) if isinstance(auths, dict) else {}
    for host, cred in settings.credentials.items():
        token = base64.b64encode(f"{cred.username}:{cred.password}".encode()).decode()
        auths[host] = {"auth": token}
    return {**data, "auths": auths}


def _write_json(path: Path, data: dict[str, Any]) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    return path


def _write_registries_conf(path: Path, settings: RegistrySettings) -> Path:
    insecure = set(settings.insecure_registries)
    hosts = sorted(set(settings.mirrors) | insecure)
    lines = ["unqualified-search-registries = []", ""]
    for host in hosts:
        lines += ["[[registry]]", f"prefix = {_toml(host)}", f"location = {_toml(host)}"]
        lines.append(f"insecure = {'true' if host in insecure else 'false'}")
        for mirror in settings.mirrors.get(host, ()):
            lines += ["[[registry.mirror]]", f"location = {_toml(mirror)}"]
            lines.append(f"insecure = {'true' if mirror in insecure else 'false'}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def _toml(text: str) -> str:
    return json.dumps(text)  # hosts are validated; a JSON string is a valid TOML basic string


def _merge_certs(dest: Path, folders: Sequence[Path]) -> Path:
    """One folder of the certificates of every ``ca_dirs`` folder (skopeo takes a single one)."""
    dest.mkdir(mode=0o700)
    for index, folder in enumerate(folders):
        if not folder.is_dir():
            raise ConfigError(f"RegistrySettings.ca_dirs: {folder} is not a folder")
        for entry in sorted(folder.iterdir()):
            if entry.suffix in _CERT_SUFFIXES and entry.is_file():
                shutil.copyfile(entry, dest / f"{index}-{entry.name}")  # the prefix keeps .cert/.key pairs
    return dest
