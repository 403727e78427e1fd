"""Templates: the recipe for a known-good state, named by a content hash."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pool.errors import ConfigError
from pool.network.policy import NetworkPolicy
from pool.resources import DEFAULT_TIMEOUT_S, Resources

HOST_BASE = "host"
"""The base that shows the host's userland read-only (the built-in suite's; no image needed)."""
HOST_IMAGE = "snapgym/host"
"""The image name a Dockerfile uses for the host base: ``FROM snapgym/host``."""


@dataclass(frozen=True, slots=True)
class DockerBuild:
    """A Dockerfile and its build context, turned into a start state by the backend.

    A backend with its own image builder (Docker, a cloud provider) builds the
    Dockerfile as it is; the local backend runs its steps in a sandbox over the
    ``FROM`` image's layers. Either way the snapshot holds what ``docker build``
    would have made, then the template's own ``setup`` and ``files``.
    """

    dockerfile: str
    """The Dockerfile's text."""
    context: str
    """Absolute path of the build context folder on this machine."""
    path: str = "Dockerfile"
    """Where the Dockerfile came from, for error messages."""
    image_sources: Mapping[str, str] = field(default_factory=dict)
    """Image name (with or without tag) -> where to get it instead: ``"host"``, a root filesystem
    path, or an image source (``oci:/layout:tag``, ``docker-archive:/x.tar``, another reference)."""
    prebuilt: str | None = None
    """An image that already holds the built result (task.toml ``docker_image``), used instead of
    building when the backend can get it and prefers prebuilt images."""

    def __post_init__(self) -> None:
        if not os.path.isabs(self.context):
            raise ConfigError(f"DockerBuild.context must be an absolute path, got {self.context!r}")
        object.__setattr__(self, "image_sources", {str(k): str(v) for k, v in dict(self.image_sources).items()})

    def fingerprint(self) -> dict[str, Any]:
        """The Dockerfile, a digest of the build context, the image sources and the prebuilt image."""
        return {
            "dockerfile": self.dockerfile,
            "context": context_digest(Path(self.context)),
            "image_sources": dict(sorted(self.image_sources.items())),
            "prebuilt": self.prebuilt,
        }


@dataclass(frozen=True, slots=True)
class Template:
    """What a snapshot is built from.

    ``backend.build(template)`` starts a sandbox over ``base``, runs ``setup``
    in order, places ``files``, runs ``healthcheck``, and freezes the result.
    Building the same template again is a cache hit: the snapshot id is a hash
    of every field here plus the identity of the base.
    """

    name: str
    """A human name; part of the hash, so two names give two snapshots."""
    base: str = HOST_BASE
    """Where the start state begins: ``"host"`` (a read-only view of the host userland and
    Python); an OCI image reference (``debian:bookworm``, ``registry:5000/team/img@sha256:...``);
    an image source with a transport (``oci:/layout[:tag]``, ``oci-archive:/img.tar``,
    ``docker-archive:/saved.tar``, ``docker-daemon:img:tag``); or the absolute path of a root
    filesystem directory or tarball (e.g. from ``docker export``). Which of these a backend
    realises is in its ``Capabilities.bases``. Ignored when ``dockerfile`` is given."""
    dockerfile: DockerBuild | None = None
    """A Dockerfile to build first (its ``FROM`` is the base); ``setup`` and ``files`` follow it."""
    setup: Sequence[str] = ()
    """Shell commands run in order as root inside the sandbox, in ``workdir``."""
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    """Files to place after setup: absolute path in the sandbox -> content."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables for setup and for every exec in episodes."""
    workdir: str | None = None
    """Default working directory, created before setup runs; None: the image's or Dockerfile's
    working directory, else ``/``."""
    healthcheck: str | None = None
    """A command that must exit 0 before the snapshot is accepted."""
    network: NetworkPolicy | bool | None = None
    """What the build's commands (setup and Dockerfile ``RUN`` steps) may reach: the build phase's
    :class:`~pool.egress.NetworkPolicy`, enforced and audited like an episode's where the backend
    can (``Capabilities.build_network_modes``); ``True`` is ``public``, ``False`` ``no-network``.
    None: as ``docker build`` does it, public when a Dockerfile runs commands (its ``RUN``
    steps and the setup after them), else no network. Episodes never inherit it."""
    setup_timeout_s: float = DEFAULT_TIMEOUT_S
    """Timeout of each setup step and of the healthcheck."""
    resources: Resources = field(default_factory=Resources)
    """What each sandbox of the snapshot gets (None fields: the backend's defaults)."""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ConfigError("Template.name must be a non-empty string")
        if isinstance(self.setup, str):
            raise ConfigError("Template.setup must be a list of commands, not one string: wrap it in [...]")
        object.__setattr__(self, "setup", tuple(self.setup))
        object.__setattr__(self, "files", dict(self.files))
        object.__setattr__(self, "env", {str(k): str(v) for k, v in dict(self.env).items()})
        if self.workdir is not None and not posixpath.isabs(self.workdir):
            raise ConfigError(f"Template.workdir must be an absolute path, got {self.workdir!r}")
        for path in self.files:
            if not posixpath.isabs(path):
                raise ConfigError(f"Template.files keys must be absolute paths, got {path!r}")
        for key in self.env:
            if not key or "=" in key or "\0" in key:
                raise ConfigError(f"Template.env has an invalid variable name {key!r}")
        if not isinstance(self.resources, Resources):
            raise ConfigError(f"Template.resources must be a pool.Resources, got {type(self.resources).__name__}")
        if self.dockerfile is not None and not isinstance(self.dockerfile, DockerBuild):
            raise ConfigError(f"Template.dockerfile must be a pool.DockerBuild, got {type(self.dockerfile).__name__}")
        if self.setup_timeout_s <= 0:
            raise ConfigError("Template.setup_timeout_s must be positive")
        if isinstance(self.network, bool):
            object.__setattr__(self, "network", NetworkPolicy.public() if self.network else NetworkPolicy.offline())
        elif self.network is not None and not isinstance(self.network, NetworkPolicy):
            try:
                object.__setattr__(self, "network", NetworkPolicy.parse(self.network))
            except (ConfigError, TypeError) as exc:
                raise ConfigError(f"Template.network: {exc}") from None

    def build_network(self, runs_commands: bool) -> NetworkPolicy:
        """The build's policy: ``network``, or for None public when a Dockerfile ``runs_commands``."""
        if isinstance(self.network, NetworkPolicy):
            return self.network
        return NetworkPolicy.public() if self.dockerfile is not None and runs_commands else NetworkPolicy.offline()

    def fingerprint(self) -> dict[str, Any]:
        """The fields that define the template's content, as JSON-ready data."""
        return {
            "name": self.name,
            "base": self.base,
            "setup": list(self.setup),
            "files": {
                path: hashlib.sha256(_as_bytes(content)).hexdigest() for path, content in sorted(self.files.items())
            },
            "env": dict(sorted(self.env.items())),
            "workdir": self.workdir,
            "healthcheck": self.healthcheck,
            "network": _network_fingerprint(self.network),
            "dockerfile": self.dockerfile.fingerprint() if self.dockerfile else None,
            "resources": self.resources.fingerprint(),
        }

    def content_hash(self, base_identity: str) -> str:
        """A hex digest naming the snapshot this template builds over a base."""
        payload = json.dumps({"template": self.fingerprint(), "base": base_identity}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()


def _network_fingerprint(policy: NetworkPolicy | bool | None) -> bool | dict[str, Any]:
    """``False`` for the default, ``True`` for public (the fields' values before build policies)."""
    if policy is None:
        return False
    assert isinstance(policy, NetworkPolicy)
    return True if policy == NetworkPolicy.public() else policy.as_dict()


def _as_bytes(content: str | bytes) -> bytes:
    return content.encode() if isinstance(content, str) else bytes(content)


def context_digest(root: Path) -> str:
    """A digest of a build context: relative paths, modes, link targets and file contents, sorted.

    Raises:
        ConfigError: the folder does not exist.
    """
    if not root.is_dir():
        raise ConfigError(f"the build context {root} is not a folder")
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted([*filenames, *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))]):
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                h.update(f"L {rel}\0{os.readlink(full)}\n".encode())
            else:
                with open(full, "rb") as f:
                    h.update(f"F {rel}\0{st.st_mode:o}\0{hashlib.file_digest(f, 'sha256').hexdigest()}\n".encode())
        for name in dirnames:
            h.update(f"D {os.path.relpath(os.path.join(dirpath, name), root)}\n".encode())
    return h.hexdigest()
