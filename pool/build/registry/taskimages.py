"""Task images for a backend whose provider pulls images itself (the cloud backends): a template's
registry images, resolved on the host (:class:`TaskImages`).

A task's ``docker_image`` (preferred when it can be had, as Harbor does) or its Dockerfile's
``FROM`` is resolved here with skopeo (:func:`pool.build.registry.resolve.resolve_image`): its
digest goes into the snapshot's content hash, its config gives every command's environment and
working folder, and the provider is asked for a build sandbox from the reference pinned to that
digest (with the registry's credentials from the backend's ``registry`` settings).
``COPY --from=<image>`` is read out of that image on the host (:mod:`pool.build.registry.extract`)
and unpacked in the build sandbox with its ``tar``.
"""

from __future__ import annotations

import shlex
import threading
import uuid

from pool.build.dockerfile import ImageCopy
from pool.build.hostview import DEFAULT_PATH
from pool.build.images import BaseConfig, file_target
from pool.build.registry.extract import image_files, placed
from pool.build.registry.resolve import ResolvedImage, resolve_image
from pool.build.registry.settings import RegistrySettings
from pool.contract import Sandbox
from pool.errors import BuildError, ConfigError, ImageError
from pool.templates import HOST_BASE

_STAGING = "/tmp/.snapgym-copy-from"


class TaskImages:
    """The registry images one cloud backend's templates start from or copy out of (thread-safe; each
    reference is resolved once per backend)."""

    def __init__(self, settings: RegistrySettings, *, backend: str) -> None:
        self.settings = settings
        self.backend = backend
        self._lock = threading.Lock()
        self._resolved: dict[str, ResolvedImage] = {}

    def resolve(self, source: str) -> ResolvedImage:
        """``source`` resolved now (once per backend).

        Raises:
            ConfigError: not a registry reference.
            ImageError: the image cannot be had; the message says how to provide it.
        """
        with self._lock:
            if source not in self._resolved:
                self._resolved[source] = resolve_image(source, self.settings)
            return self._resolved[source]

    def base_config(self, spec: str) -> BaseConfig:
        """The environment and working folder of a base (the provider's own for ``host``)."""
        if spec == HOST_BASE:
            return BaseConfig()
        config = self.resolve(spec).config
        return BaseConfig(env={"PATH": DEFAULT_PATH, **config.env}, workdir=config.workdir)

    def can_get(self, spec: str) -> bool:
        """Whether a task's prebuilt image can be had (else its Dockerfile is built)."""
        try:
            self.resolve(spec)
        except (ImageError, ConfigError):
            return False
        return True

    def identity(self, base: str, copied: tuple[str, ...]) -> str:
        """What the base and the images copied from are, for the content hash (their digests)."""
        digests = [self.resolve(image).digest for image in (base, *copied)]
        return "image:" + ",".join(digests)

    def copy_from_image(self, sandbox: Sandbox, step: ImageCopy) -> None:
        """``COPY --from=<image>``: the files, read from the image on the host, unpacked in the sandbox.

        Raises:
            BuildError: a source is not in the image, or the build sandbox cannot unpack a tar.
        """
        resolved = self.resolve(step.image)
        entries, found = image_files(resolved.reference, resolved.digest, step.sources, self.settings)
        moves = [(f.source, step.dest if f.is_dir else file_target(sandbox, step, f.source)) for f in found]
        archive = placed(entries, moves, step.mode)
        staging = f"{_STAGING}-{uuid.uuid4().hex[:12]}.tar"
        sandbox.write_file(staging, archive)
        done = sandbox.exec(f"tar -xpf {shlex.quote(staging)} -C / && rm -f {shlex.quote(staging)}", timeout_s=600,
                            cwd="/")  # fmt: skip
        if not done.ok:
            raise BuildError(
                f"COPY --from={step.image}: unpacking the files in the build sandbox failed (exit {done.exit_code}; "
                f"the {self.backend} backend unpacks them with the base image's tar): {done.stderr[-1000:]}"
            )
