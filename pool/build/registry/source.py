"""Image sources: what a template names as its base image, parsed and normalised.

A source is a registry reference (``debian:bookworm``, ``localhost:5000/x/y:tag``,
``ref@sha256:...``, optionally written ``docker://...``) or a local image with a
skopeo transport: ``oci:/path/layout[:tag]``, ``oci-archive:/path.tar[:tag]``,
``docker-archive:/path.tar[:ref]`` (a ``docker save`` archive) or
``docker-daemon:name:tag`` (an image of a local Docker engine). Registry
references are normalised the way Docker does (``debian`` is
``docker.io/library/debian:latest``), and paths are made absolute, so two
spellings of one image share a cache entry.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

from pool.build.registry.references import DOCKER_HUB, normalize_host, normalize_reference
from pool.errors import ConfigError

__all__ = ["DOCKER_HUB", "ImageSource", "Transport", "normalize_host", "normalize_reference", "parse_source"]


class Transport(enum.Enum):
    """Where an image comes from (the skopeo transport names)."""

    REGISTRY = "docker"
    OCI = "oci"
    OCI_ARCHIVE = "oci-archive"
    DOCKER_ARCHIVE = "docker-archive"
    DOCKER_DAEMON = "docker-daemon"


_LOCAL_PREFIXES = {f"{t.value}:": t for t in Transport if t is not Transport.REGISTRY}


@dataclass(frozen=True, slots=True)
class ImageSource:
    """A parsed image source."""

    text: str
    """The source as given, for messages."""
    transport: Transport
    reference: str
    """Registry: ``host/repo:tag`` or ``host/repo@sha256:...`` (normalised); otherwise the part after the transport."""
    pinned: str | None = None
    """The ``sha256:...`` digest a registry reference is pinned to, if any."""

    @property
    def skopeo_name(self) -> str:
        """The image name skopeo takes (``docker://...``, ``oci:...``)."""
        if self.transport is Transport.REGISTRY:
            return f"docker://{self.reference}"
        return f"{self.transport.value}:{self.reference}"

    @property
    def host(self) -> str | None:
        """The registry host of a registry reference (``docker.io`` for Docker Hub); None otherwise."""
        if self.transport is not Transport.REGISTRY:
            return None
        return self.reference.split("/", 1)[0]

    @property
    def repository(self) -> str:
        """A registry reference without its tag and digest (``docker.io/library/debian``)."""
        name = self.reference.split("@", 1)[0]
        last = name.rsplit("/", 1)
        if ":" in last[-1]:
            name = name[: name.rindex(":")]
        return name

    def at_digest(self, digest: str) -> str:
        """The skopeo name of this registry image's repository at ``digest``."""
        return f"docker://{self.repository}@{digest}"

    def layout_path(self) -> str | None:
        """The folder of an ``oci:`` source (its tag after the first colon); None for other transports."""
        if self.transport is not Transport.OCI:
            return None
        return self.reference.split(":", 1)[0]

    def layout_tag(self) -> str | None:
        """The tag of an ``oci:`` source, if it names one."""
        if self.transport is not Transport.OCI or ":" not in self.reference:
            return None
        return self.reference.split(":", 1)[1] or None


def parse_source(text: str) -> ImageSource:
    """Parse and normalise an image source.

    Raises:
        ConfigError: not an image source (the message shows the accepted forms).
    """
    if not isinstance(text, str) or not text.strip() or "\0" in text or "\n" in text:
        raise ConfigError(f"{text!r} is not an image source: {_FORMS}")
    for prefix, transport in _LOCAL_PREFIXES.items():
        if text.startswith(prefix):
            rest = text[len(prefix) :]
            if not rest:
                raise ConfigError(f"image source {text!r} names nothing after {prefix!r}: {_FORMS}")
            if transport is not Transport.DOCKER_DAEMON:
                rest = _absolute(rest)
            return ImageSource(text, transport, rest)
    reference, pinned = normalize_reference(text.removeprefix("docker://"), original=text)
    return ImageSource(text, Transport.REGISTRY, reference, pinned)


def _absolute(rest: str) -> str:
    path, sep, tail = rest.partition(":")
    return os.path.abspath(os.path.expanduser(path)) + sep + tail


_FORMS = (
    "use a registry reference (debian:bookworm, registry.example.com:5000/team/image:tag, "
    "image@sha256:<64 hex>, optionally with docker://), oci:/path/to/layout[:tag], "
    "oci-archive:/path/image.tar, docker-archive:/path/saved.tar (from `docker save`) or docker-daemon:name:tag"
)
