"""Fetching OCI images with skopeo into one verified cache, without a Docker engine.

:class:`ImageFetcher` copies an image (see :mod:`pool.build.registry.source` for the forms a
source takes) into a single OCI layout under its cache folder, tagged by a key
derived from the source and platform, so blobs are stored once however many
images share them. Copies hold an ``fcntl`` lock on the cache, so processes
can fetch at once.

Trust: a registry source is first resolved to the digest of the manifest (or
index) it names, with ``skopeo inspect --raw``, hashed here; a ``@sha256:`` pin
must equal it. The copy is then made by that digest, so what is copied is what
was resolved even if the tag moves meanwhile (skopeo checks every blob it
downloads against its digest). After the copy every blob the image uses (its
manifest, config and layers) is hashed again in the cache: a damaged one is
removed and fetched once more, and if it is still damaged the fetch fails,
naming the blob. A layer's ``diff_id`` (the digest of its uncompressed tar) is
checked when it is unpacked (:mod:`ocilayer`).

The cache is never pruned here; ``umoci gc --layout CACHE/layout`` removes blobs
no tag uses.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pool.backends.local.oci import layout
from pool.backends.local.oci.layout import LayoutImage
from pool.build.registry.fetcherrors import OFFLINE
from pool.build.registry.imageconfig import ImageConfig
from pool.build.registry.settings import RegistrySettings
from pool.build.registry.skopeo import Skopeo
from pool.build.registry.source import ImageSource, Transport, parse_source
from pool.errors import ImageError

__all__ = ["ImageFetcher", "LayerBlob", "PulledImage"]

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_OCI_CONFIG = "application/vnd.oci.image.config.v1+json"


@dataclass(frozen=True, slots=True)
class LayerBlob:
    """One layer of a fetched image, verified in the cache."""

    digest: str
    """``sha256:...`` of the blob as stored (compressed or not)."""
    media_type: str
    path: Path
    """The blob file in the cache (read-only use)."""
    diff_id: str
    """``sha256:...`` of the uncompressed tar, from the image config."""


@dataclass(frozen=True, slots=True)
class PulledImage:
    """An image in the fetch cache, every blob checked against its digest."""

    source: str
    """The source as given."""
    resolved_digest: str
    """What the source named when fetched: the digest of the registry's manifest or index (a pin's own
    digest), of an ``oci:`` layout's entry, or of the copied manifest for archives and the Docker engine."""
    manifest_digest: str
    """The digest of the image manifest in the cache."""
    config_digest: str
    """The digest of the image config in the cache (skopeo rewrites a Docker schema 2 config as OCI)."""
    layers: tuple[LayerBlob, ...]
    """Bottom layer first."""
    config: ImageConfig
    platform: str
    """The platform it was fetched for (``linux/amd64``)."""


class ImageFetcher:
    """Fetches images into a verified OCI layout cache with skopeo.

    Args:
        cache_dir: where the cache lives (made 0700); shared by every image fetched into it.
        settings: how to reach registries; anonymous by default.

    Raises:
        UnsupportedError: skopeo is not installed.
    """

    def __init__(self, cache_dir: str | os.PathLike[str], *, settings: RegistrySettings | None = None) -> None:
        self.cache_dir = Path(cache_dir)
        self.settings = settings or RegistrySettings()
        self.layout = self.cache_dir / "layout"
        (self.cache_dir / "tmp").mkdir(parents=True, exist_ok=True)
        os.chmod(self.cache_dir, 0o700)
        self._skopeo = Skopeo(self.settings, tmp_dir=self.cache_dir / "tmp")

    def resolve(self, source: str) -> str | None:
        """The digest ``source`` names now, without copying anything; None when only a fetch can tell.

        A pinned registry reference needs no network; a tag costs one manifest request; an
        ``oci:`` layout is read from disk; archives and the Docker engine give None.

        Raises:
            ConfigError: not an image source.
            ImageError: the image cannot be reached or found.
        """
        src = parse_source(source)
        if src.transport is Transport.REGISTRY:
            return src.pinned or self._registry_manifest(src)[0]
        if src.transport is Transport.OCI:
            return layout.tag_digest(Path(src.layout_path() or ""), src.layout_tag(), image=source)
        return None

    def fetch(self, source: str) -> PulledImage:
        """Copy ``source`` into the cache (blobs already there are reused) and verify it.

        Raises:
            ConfigError: not an image source.
            ImageError: the image is not found, access is refused, the registry is unreachable, a blob
                differs from its digest even after a second fetch, a pin does not match, or the image is
                for another platform; the message says how to provide the image.
            UnsupportedError: skopeo is missing.
        """
        src = parse_source(source)
        resolved: str | None = None
        raw: dict[str, Any] | None = None
        copy_from = src.skopeo_name
        if src.transport is Transport.REGISTRY:
            resolved, raw = self._registry_manifest(src)
            copy_from = src.at_digest(resolved)
        elif src.transport is Transport.OCI:
            resolved = self.resolve(source)
        tag = _cache_tag(src, self.settings.platform)
        with self._locked():
            found = self._copy_and_check(src, copy_from, tag)
        if raw is not None:
            _check_same_content(source, raw, found)
        return self._pulled(src, resolved or found.manifest.digest, found)

    # -- internals --------------------------------------------------------------

    def _registry_manifest(self, src: ImageSource) -> tuple[str, dict[str, Any]]:
        """The digest and content of the manifest or index a registry reference names now."""
        name = src.at_digest(src.pinned) if src.pinned else src.skopeo_name
        raw = self._skopeo.inspect_raw(name, image=src.text, host=src.host)
        digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        if src.pinned and digest != src.pinned:
            raise ImageError(
                f"image {src.text} is pinned to {src.pinned}, but {src.host} served a manifest whose digest is "
                f"{digest}; the registry (or a mirror) serves other content under that digest: fetch from "
                f"another registry, {OFFLINE}"
            )
        data = layout.parse_json(raw, what=f"the manifest of {src.text}", image=src.text)
        if data.get("schemaVersion") == 1:
            raise ImageError(
                f"image {src.text} has a Docker schema 1 manifest, which is not supported (deprecated since "
                "2017): push it again with a current Docker or skopeo"
            )
        return digest, data

    def _copy_and_check(self, src: ImageSource, copy_from: str, tag: str) -> LayoutImage:
        dest = f"oci:{self.layout}:{tag}"
        self._skopeo.copy(copy_from, dest, image=src.text, host=src.host)
        damaged = layout.damaged_blobs(self.layout, tag, image=src.text)
        if damaged:  # damaged in the cache since an earlier fetch: fetch those again, once
            for blob in damaged:
                layout.blob_path(self.layout, blob.digest).unlink(missing_ok=True)
            self._skopeo.copy(copy_from, dest, image=src.text, host=src.host)
            damaged = layout.damaged_blobs(self.layout, tag, image=src.text)
        if damaged:
            blob = damaged[0]
            raise ImageError(
                f"image {src.text}: blob {blob.digest} ({blob.media_type}) in the image cache "
                f"{layout.blob_path(self.layout, blob.digest)} differs from its digest even after fetching it "
                f"again; the source serves it damaged: push the image again, {OFFLINE}"
            )
        return layout.read_image(self.layout, tag, image=src.text)

    def _pulled(self, src: ImageSource, resolved: str, found: LayoutImage) -> PulledImage:
        config = found.config_data
        _check_platform(src.text, config, self.settings)
        diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
        if len(diff_ids) != len(found.layers) or not all(isinstance(d, str) and _DIGEST.match(d) for d in diff_ids):
            raise ImageError(
                f"image {src.text}: its config lists {len(diff_ids)} layer diff_ids for {len(found.layers)} "
                "layers, or one is not a sha256 digest; the image is malformed: build and push it again"
            )
        layers = tuple(
            LayerBlob(d.digest, d.media_type, layout.blob_path(self.layout, d.digest), diff_id)
            for d, diff_id in zip(found.layers, diff_ids, strict=True)
        )
        return PulledImage(
            source=src.text,
            resolved_digest=resolved,
            manifest_digest=found.manifest.digest,
            config_digest=found.config.digest,
            layers=layers,
            config=ImageConfig.from_image_config(config),
            platform=self.settings.platform,
        )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # flock on a descriptor of our own: excludes other processes and other threads alike
        with open(self.cache_dir / "lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield


def _cache_tag(src: ImageSource, platform: str) -> str:
    key = f"{src.transport.value}:{src.reference}\0{platform}"
    return "snapgym-" + hashlib.sha256(key.encode()).hexdigest()[:40]


def _check_same_content(image: str, raw: dict[str, Any], found: LayoutImage) -> None:
    """When the registry served an image manifest, the cache must hold its layers (and its config, if OCI)."""
    config, layers = raw.get("config"), raw.get("layers")
    if not isinstance(config, dict) or not isinstance(layers, list):
        return  # an index: skopeo picked the platform's manifest and checked it against the index
    expected = [layer.get("digest") if isinstance(layer, dict) else None for layer in layers]
    copied = [layer.digest for layer in found.layers]
    if config.get("mediaType") == _OCI_CONFIG:  # a Docker schema 2 config is rewritten as OCI in the cache
        expected.append(config.get("digest"))
        copied.append(found.config.digest)
    if expected != copied:
        raise ImageError(
            f"image {image}: the cached copy's blobs ({copied}) are not the ones the registry's manifest "
            f"names ({expected}); delete the cache folder and fetch again"
        )


def _check_platform(image: str, config: Mapping[str, Any], settings: RegistrySettings) -> None:
    os_name, arch, variant = config.get("os"), config.get("architecture"), config.get("variant")
    if not os_name and not arch:
        return  # an image config without a platform (some hand-made images): nothing to check
    if (os_name, arch) != (settings.os, settings.arch) or (
        variant and settings.variant and variant != settings.variant
    ):
        made_for = "/".join(str(p) for p in (os_name, arch, variant) if p)
        raise ImageError(
            f"image {image} is made for {made_for}, not {settings.platform}; its programs would not run here. "
            "Fetch the variant for this platform (RegistrySettings(platform=...) picks one from a multi-platform image)"
        )
