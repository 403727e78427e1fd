"""Registry image references, read the way Docker reads them: ``debian`` is
``docker.io/library/debian:latest``, Docker Hub's aliases are ``docker.io``.

Shared by every backend that names images by reference (the local backend's fetches, the Docker
backend's pulls through a mirror), so both read a task's ``FROM`` and ``docker_image`` alike.
"""

from __future__ import annotations

import re

from pool.errors import ConfigError

DOCKER_HUB = "docker.io"
_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = re.compile(rf"^(?:{_LABEL})(?:\.{_LABEL})*(?::\d+)?$")
_PATH_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
FORMS = (
    "use a registry reference (debian:bookworm, registry.example.com:5000/team/image:tag, "
    "image@sha256:<64 hex>, optionally with docker://)"
)
"""How a registry reference is written, for error messages."""


def normalize_reference(ref: str, *, original: str | None = None) -> tuple[str, str | None]:
    """``(host/repo:tag or host/repo@digest, pinned digest)`` for a registry reference, as Docker reads it.

    Raises:
        ConfigError: the reference is malformed.
    """
    shown = original or ref
    name, _, digest = ref.partition("@")
    if digest and not _DIGEST.match(digest):
        raise ConfigError(f"image {shown!r}: a pinned digest must be sha256: and 64 lowercase hex digits")
    tag = None
    head, _, last = name.rpartition("/")
    if ":" in last:
        last, tag = last.split(":", 1)
        name = f"{head}/{last}" if head else last
    host, _, path = name.partition("/")
    if not path or not (host == "localhost" or "." in host or ":" in host):
        host, path = DOCKER_HUB, name
    host = normalize_host(host)
    if host == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not _DOMAIN.match(host) or not all(_PATH_COMPONENT.match(part) for part in path.split("/")):
        raise ConfigError(f"{shown!r} is not a valid image reference: {FORMS}")
    if tag is not None and not _TAG.match(tag):
        raise ConfigError(f"image {shown!r}: {tag!r} is not a valid tag")
    if digest:
        return f"{host}/{path}{':' + tag if tag else ''}@{digest}", digest
    return f"{host}/{path}:{tag or 'latest'}", None


def normalize_host(host: str) -> str:
    """A registry host as registries.conf and auth files name it (Docker Hub's aliases are ``docker.io``)."""
    host = host.strip().lower()
    return DOCKER_HUB if host in _HUB_ALIASES else host


def split_reference(normalized: str) -> tuple[str, str, str]:
    """``(host, path, ":tag" or "@digest")`` of a reference :func:`normalize_reference` returned."""
    host, _, rest = normalized.partition("/")
    if "@" in rest:
        path, _, digest = rest.partition("@")
        return host, path.rsplit(":", 1)[0] if ":" in path.rsplit("/", 1)[-1] else path, f"@{digest}"
    path, _, tag = rest.rpartition(":")
    return host, path, f":{tag}"
