"""Where a template starts: every kind of base, realised as an image in the engine.

- ``host``: a tiny skeleton image (mount points, links, a minimal /etc, made by
  :func:`pool.build.hostview.write_skeleton` and ``docker import``-ed), which every
  container of the snapshot runs with the host's /usr (and /bin, /lib* where
  they are folders) and the Python prefix bound read-only: exactly the local
  backend's host view. Its identity is the host's package fingerprint.
- a root filesystem folder or tarball: ``docker import``; identity: its content.
- ``docker-archive:/saved.tar[:ref]``: ``docker load``; ``oci:/layout[:tag]`` and
  ``oci-archive:/img.tar[:tag]``: ``skopeo copy`` into the engine;
  ``docker-daemon:ref``: the engine's own; anything else is a registry
  reference the engine has or pulls (from the backend's ``registry.mirrors`` first, tagged
  then with the name the task used). Identity: the image ID.

Imported and loaded bases are tagged ``<prefix>/base:<key>`` so the next
process finds them without importing again.
"""

from __future__ import annotations

import hashlib
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pool.backends.docker.transport.engine import engine_errors
from pool.build import hostview
from pool.build.digest import source_key
from pool.build.registry.references import normalize_reference, split_reference
from pool.build.rootfs import RootfsSource
from pool.errors import BackendError, ConfigError
from pool.templates import HOST_BASE

TRANSPORTS = ("docker-archive:", "oci:", "oci-archive:", "docker-daemon:", "docker://")


@dataclass(frozen=True, slots=True)
class BaseImage:
    """An image a template's build starts from."""

    image_id: str
    identity: str
    """What the template's content hash is taken over."""
    env: dict[str, str]
    workdir: str | None
    entrypoint: list[str] | None
    cmd: list[str] | None
    is_host: bool = False
    """The host base: containers get the host view's read-only binds."""

    @classmethod
    def of(cls, attrs: Mapping[str, Any], *, identity: str | None = None, is_host: bool = False) -> BaseImage:
        """From an image's ``inspect`` attributes."""
        config = attrs.get("Config") or {}
        env: dict[str, str] = {}
        for entry in config.get("Env") or ():
            key, _, value = entry.partition("=")
            env[key] = value
        return cls(
            image_id=str(attrs["Id"]),
            identity=identity or str(attrs["Id"]),
            env=env,
            workdir=config.get("WorkingDir") or None,
            entrypoint=config.get("Entrypoint"),
            cmd=config.get("Cmd"),
            is_host=is_host,
        )


def missing_image_error(reference: str, why: str) -> ConfigError:
    """The error for an image the engine cannot get, saying how to provide it."""
    return ConfigError(
        f"the Docker engine has no image {reference!r} and cannot pull it ({why}). Provide it: save it on a "
        f"machine that can pull it (docker pull {reference} && docker save {reference} -o image.tar) and load "
        "it here (docker load -i image.tar, or use 'docker-archive:/path/image.tar' as the base or image "
        "source); or pull through a registry mirror (backend.registry.mirrors={docker.io:[host:port]}, or "
        "dockerd --registry-mirror=...); or log in to a "
        "private registry (docker login)"
    )


class Bases:
    """The engine's images for template bases, made on first use and cached."""

    def __init__(
        self, client: Any, *, prefix: str, base_url: str, mirrors: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        self._client = client
        self._mirrors = dict(mirrors or {})
        self._prefix = prefix
        self._base_url = base_url
        self._lock = threading.Lock()
        self._known: dict[str, BaseImage] = {}
        self.host_view = hostview.discover()

    def get(self, spec: str) -> BaseImage:
        """The image for a template's ``base``.

        Raises:
            ConfigError: a missing root filesystem, archive or image (saying how to provide it).
            BackendError: the engine refused an import.
        """
        with self._lock:
            if spec not in self._known:
                self._known[spec] = self._realise(spec)
            return self._known[spec]

    def image(self, reference: str) -> BaseImage:
        """An image by reference: the engine's, or pulled.

        Raises:
            ConfigError: the engine has it not and cannot pull it.
        """
        reference = reference.removeprefix("docker://")
        images = self._client.images
        try:
            with engine_errors(f"looking up the image {reference}"):
                return BaseImage.of(images.get(reference).attrs)
        except BackendError:
            pass
        failures = []
        for candidate, name in self._pulls(reference):
            try:
                with engine_errors(f"pulling the image {candidate}"):
                    pulled = images.pull(candidate)
            except BackendError as exc:
                failures.append(f"{candidate}: {str(exc).split(': ', 1)[-1]}")
                continue
            if name is not None:  # from a mirror: found again by the name the task used
                with engine_errors(f"tagging {candidate} as {name[0]}:{name[1]}"):
                    pulled.tag(*name)
            return BaseImage.of(pulled.attrs)
        raise missing_image_error(reference, "; ".join(failures))

    def _pulls(self, reference: str) -> list[tuple[str, tuple[str, str] | None]]:
        """What to pull for ``reference``, in order: its registry's mirrors (each with the
        ``(repository, tag)`` to tag the result with, None for a pinned digest), then itself."""
        try:
            host, path, suffix = split_reference(normalize_reference(reference)[0])
        except ConfigError:
            return [(reference, None)]  # the engine says what is wrong with it
        name = (f"{host}/{path}", suffix[1:]) if suffix.startswith(":") else None
        return [*((f"{mirror}/{path}{suffix}", name) for mirror in self._mirrors.get(host, ())), (reference, None)]

    def _realise(self, spec: str) -> BaseImage:
        if spec == HOST_BASE:
            return self._host()
        if spec.startswith("docker-daemon:"):
            reference = spec.removeprefix("docker-daemon:")
            with engine_errors(f"looking up {reference}", missing=lambda why: missing_image_error(reference, why)):
                return BaseImage.of(self._client.images.get(reference).attrs)
        if spec.startswith("docker-archive:"):
            return self._archive(spec)
        if spec.startswith(("oci:", "oci-archive:")):
            return self._oci(spec)
        if spec.startswith(("/", "~", ".")) and not spec.startswith("docker://"):
            return self._rootfs(spec)
        return self.image(spec)

    # -- kinds of base ----------------------------------------------------------

    def _host(self) -> BaseImage:
        fingerprint = hostview.fingerprint(self.host_view)
        identity = f"host:{fingerprint}"
        tag = f"{self._prefix}/base:host-{fingerprint[:32]}"

        def make() -> None:
            with tempfile.TemporaryDirectory(prefix="snapgym-hostbase-") as tmp:
                root = Path(tmp) / "root"
                root.mkdir()
                hostview.write_skeleton(self.host_view, root)
                tarball = Path(tmp) / "skeleton.tar"
                _tar_tree(root, tarball, root_owned=True)
                self._import(tarball, tag)

        return self._tagged_or_made(tag, identity, make, is_host=True)

    def _rootfs(self, spec: str) -> BaseImage:
        rootfs = RootfsSource.find(spec, other_bases=("'host'", "an image"))
        source, tag = rootfs.path, f"{self._prefix}/base:{rootfs.name}"

        def make() -> None:
            if source.is_dir():
                with tempfile.TemporaryDirectory(prefix="snapgym-rootfs-") as tmp:
                    tarball = Path(tmp) / "rootfs.tar"
                    _tar_tree(source, tarball, root_owned=False)
                    self._import(tarball, tag)
            else:
                self._import(source, tag)

        return self._tagged_or_made(tag, rootfs.identity, make)

    def _archive(self, spec: str) -> BaseImage:
        path, reference = _split_source(spec.removeprefix("docker-archive:"))
        source = Path(path).expanduser()
        if not source.is_file():
            raise ConfigError(f"the image archive {path} does not exist (make one with: docker save IMAGE -o {path})")
        tag = f"{self._prefix}/base:archive-{source_key(source)[:32]}{_suffix(reference)}"
        if found := self._tagged(tag, None):
            return found
        with engine_errors(f"loading the image archive {source}"), source.open("rb") as f:
            loaded = self._client.images.load(f)
        chosen = [i for i in loaded if not reference or _has_tag(i.attrs, reference)]
        if len(chosen) != 1:
            names = ", ".join(t for i in loaded for t in i.attrs.get("RepoTags") or ()) or "untagged images"
            raise ConfigError(f"{spec}: name one image of the archive ({names}) as docker-archive:{path}:NAME")
        with engine_errors(f"tagging the image from {source}"):
            chosen[0].tag(tag)
        return BaseImage.of(chosen[0].attrs)

    def _oci(self, spec: str) -> BaseImage:
        path, _ = _split_source(spec.split(":", 1)[1])
        source = Path(path).expanduser()
        if not source.exists():
            raise ConfigError(f"the OCI image {path} does not exist")
        tag = f"{self._prefix}/base:oci-{hashlib.sha256(spec.encode()).hexdigest()[:16]}-{source_key(source)[:16]}"
        return self._tagged_or_made(tag, None, lambda: self._copy_oci(spec, tag))

    def _copy_oci(self, spec: str, tag: str) -> None:
        """Copy the OCI image ``spec`` (``oci:`` or ``oci-archive:``) into the engine as ``tag``, with skopeo."""
        daemon_host = ["--dest-daemon-host", self._base_url] if self._base_url else []
        try:
            proc = subprocess.run(
                ["skopeo", "copy", *daemon_host, spec, f"docker-daemon:{tag}"],
                capture_output=True,
                text=True,
            )
        except FileNotFoundError:
            raise ConfigError(
                f"base {spec!r} needs skopeo to copy the OCI image into the engine; install it "
                "(Debian/Ubuntu: apt-get install skopeo) or use a docker-archive (docker save) instead"
            ) from None
        if proc.returncode != 0:
            raise ConfigError(
                f"copying {spec} into the Docker engine with skopeo failed: {proc.stderr.strip()[-1500:]}"
            )

    # -- engine ---------------------------------------------------------------

    def _tagged_or_made(
        self, tag: str, identity: str | None, make: Callable[[], None], *, is_host: bool = False
    ) -> BaseImage:
        """The base image tagged ``tag``; when the engine has none, ``make()`` imports it under that tag first."""
        if found := self._tagged(tag, identity, is_host=is_host):
            return found
        make()
        found = self._tagged(tag, identity, is_host=is_host)
        assert found is not None
        return found

    def _tagged(self, tag: str, identity: str | None, *, is_host: bool = False) -> BaseImage | None:
        with engine_errors(f"looking up {tag}"):
            try:
                attrs = self._client.api.inspect_image(tag)
            except Exception as exc:
                if getattr(exc, "status_code", None) == 404:
                    return None
                raise
        return BaseImage.of(attrs, identity=identity, is_host=is_host)

    def _import(self, tarball: Path, tag: str) -> None:
        repository, version = tag.rsplit(":", 1)
        with engine_errors(f"importing {tarball} into the Docker engine"):
            self._client.api.import_image_from_file(str(tarball), repository=repository, tag=version)


def _tar_tree(root: Path, dest: Path, *, root_owned: bool) -> None:
    def owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
        if root_owned:
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
        return info

    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(root.iterdir()):
            tar.add(entry, arcname=entry.name, filter=owner)


def _split_source(rest: str) -> tuple[str, str | None]:
    """``/path[:ref]`` -> (path, ref)."""
    path, sep, reference = rest.partition(":")
    return path, reference if sep and reference else None


def _suffix(reference: str | None) -> str:
    return f"-{hashlib.sha256(reference.encode()).hexdigest()[:8]}" if reference else ""


def _has_tag(attrs: Mapping[str, Any], reference: str) -> bool:
    tags = attrs.get("RepoTags") or ()
    return reference in tags or f"{reference}:latest" in tags or f"docker.io/{reference}" in tags
