"""What a registry image is, read from the host without copying it: :func:`resolve_image`.

A backend whose provider pulls images itself (the cloud backends) still decides on the host
which image a template starts from: the reference is resolved to the digest of the manifest (or
index) the registry serves now, a ``@sha256:`` pin must equal it, and the provider is handed the
reference pinned to that digest, so it runs exactly what was resolved even if the tag moves; the
digest is part of the snapshot's identity. The image config gives the environment and working
folder every command runs with, as on the backends that unpack images themselves.
"""

from __future__ import annotations

import base64
import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pool.build.registry.imageconfig import ImageConfig
from pool.build.registry.settings import Credentials, RegistrySettings
from pool.build.registry.skopeo import Skopeo
from pool.build.registry.source import Transport, parse_source
from pool.errors import ConfigError, ImageError


@dataclass(frozen=True, slots=True)
class ResolvedImage:
    """A registry image as resolved now."""

    source: str
    """The reference as written (``debian:bookworm``)."""
    reference: str
    """Where it is pulled from, pinned: ``host/path@sha256:...`` (a configured mirror's host when the
    registry has one, as skopeo reads through it)."""
    digest: str
    """The manifest's (or index's) digest."""
    config: ImageConfig
    credentials: Credentials | None = field(default=None, repr=False)
    """The registry's credentials from the settings (or their auth file), if any."""
    insecure: bool = False
    """The registry it is pulled from is reached over plain HTTP."""


def resolve_image(source: str, settings: RegistrySettings) -> ResolvedImage:
    """Resolve ``source`` (a registry reference) to its digest and config.

    Raises:
        ConfigError: ``source`` is not a registry reference (an archive or a layout cannot be handed to
            a provider: push it to a registry the provider reaches).
        ImageError: the registry cannot be reached, refuses, has no such image, or serves a manifest
            whose digest differs from the pin.
        UnsupportedError: skopeo is not installed.
    """
    src = parse_source(source)
    if src.transport is not Transport.REGISTRY or src.host is None:
        raise ConfigError(
            f"image {source!r} is not in a registry; a provider pulls images from registries only: push it "
            "(skopeo copy ... docker://registry.example.com/name:tag) and name that reference"
        )
    with tempfile.TemporaryDirectory(prefix="snapgym-resolve-") as tmp:
        skopeo = Skopeo(settings, tmp_dir=Path(tmp))
        name = src.at_digest(src.pinned) if src.pinned else src.skopeo_name
        raw = skopeo.inspect_raw(name, image=src.text, host=src.host)
        digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        if src.pinned and digest != src.pinned:
            raise ImageError(
                f"image {src.text} is pinned to {src.pinned}, but {src.host} served a manifest whose digest is "
                f"{digest}: the registry (or a mirror) serves other content under that name"
            )
        document = skopeo.inspect_config(src.at_digest(digest), image=src.text, host=src.host)
    config = ImageConfig.from_image_config(_json(document, src.text))
    host, _, path = src.repository.partition("/")
    pulled_from = next(iter(settings.mirrors.get(host, ())), host)
    return ResolvedImage(
        source=source,
        reference=f"{pulled_from}/{path}@{digest}",
        digest=digest,
        config=config,
        credentials=credentials_for(settings, pulled_from),
        insecure=pulled_from in settings.insecure_registries,
    )


def credentials_for(settings: RegistrySettings, host: str) -> Credentials | None:
    """The credentials the settings hold for ``host``: its ``credentials`` entry, else its auth file's.

    Raises:
        ConfigError: the auth file cannot be read.
    """
    if host in settings.credentials:
        return settings.credentials[host]
    if settings.auth_file is None:
        return None
    try:
        auths = json.loads(settings.auth_file.read_text()).get("auths") or {}
        token = (auths.get(host) or auths.get(f"https://{host}") or {}).get("auth")
        if not token:
            return None
        username, _, password = base64.b64decode(token).decode().partition(":")
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(f"RegistrySettings.auth_file {settings.auth_file} cannot be read: {exc}") from None
    return Credentials(username, password)


def _json(raw: bytes, image: str) -> dict[str, object]:
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ImageError(f"image {image}: its registry served an image config that is not a JSON object")
    return data
