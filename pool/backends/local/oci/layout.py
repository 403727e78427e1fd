"""Reading an OCI image layout: its index, and an image's manifest, config and layers.

A layout is a folder with ``index.json`` (tagged manifests) and
``blobs/sha256/<hex>`` files named by the SHA-256 of their content. Every blob
read here is checked against the digest that names it: :func:`damaged_blobs`
hashes all of an image's blobs (layers included), :func:`read_image` the small
ones it parses (manifest, config).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pool.build.digest import file_sha256
from pool.errors import ImageError

REF_NAME = "org.opencontainers.image.ref.name"
MANIFEST_TYPES = frozenset(
    {"application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"}
)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_MAX_JSON_BYTES = 4 << 20  # manifests and configs are kilobytes; refuse absurd ones before reading them


@dataclass(frozen=True, slots=True)
class Descriptor:
    """A reference to a blob: its media type, digest and size."""

    media_type: str
    digest: str
    size: int

    @classmethod
    def from_json(cls, data: object, *, what: str, image: str) -> Descriptor:
        """A descriptor from its JSON object, checked.

        Raises:
            ImageError: malformed, or a digest algorithm other than sha256.
        """
        if not isinstance(data, dict):
            raise _malformed(image, f"{what} is not a descriptor object")
        digest, size = data.get("digest"), data.get("size")
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            raise _malformed(image, f"{what} has digest {digest!r}; only sha256:<64 hex> digests are supported")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise _malformed(image, f"{what} has size {size!r}")
        return cls(str(data.get("mediaType") or ""), digest, size)


@dataclass(frozen=True, slots=True)
class LayoutImage:
    """An image of a layout: the descriptors of its blobs and its parsed config."""

    manifest: Descriptor
    config: Descriptor
    config_data: Mapping[str, Any]
    layers: tuple[Descriptor, ...]


def blob_path(layout: Path, digest: str) -> Path:
    """Where a blob lives in a layout."""
    return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


def parse_json(data: bytes, *, what: str, image: str) -> dict[str, Any]:
    """A JSON object, or ImageError naming ``what`` is malformed."""
    try:
        parsed = json.loads(data)
    except ValueError as exc:
        raise _malformed(image, f"{what} is not JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise _malformed(image, f"{what} is not a JSON object")
    return parsed


def tag_digest(layout: Path, tag: str | None, *, image: str) -> str:
    """The digest of the manifest (or index) a layout tags ``tag``; without a tag, its only entry.

    Raises:
        ImageError: no layout there, no such tag, or no tag given and several entries.
    """
    return _entry(layout, tag, image=image).digest


def damaged_blobs(layout: Path, tag: str, *, image: str) -> tuple[Descriptor, ...]:
    """The blobs of the image tagged ``tag`` that are missing or differ from their digest (manifest first).

    A damaged manifest hides the other blobs, so it is then the only one named.
    """
    manifest = _entry(layout, tag, image=image)
    if not _intact(layout, manifest):
        return (manifest,)
    config, layers = _parse_manifest(layout, manifest, image=image)
    return tuple(blob for blob in (config, *layers) if not _intact(layout, blob))


def read_image(layout: Path, tag: str, *, image: str) -> LayoutImage:
    """The image tagged ``tag``, its manifest and config checked against their digests.

    Raises:
        ImageError: a blob is damaged or malformed, or a layer has a type that cannot be unpacked.
    """
    manifest = _entry(layout, tag, image=image)
    config, layers = _parse_manifest(layout, manifest, image=image)
    for index, layer in enumerate(layers, 1):
        if "encrypted" in layer.media_type or not ("layer" in layer.media_type or "rootfs" in layer.media_type):
            raise ImageError(
                f"image {image}: layer {index} has media type {layer.media_type!r}, which cannot be unpacked "
                "(encrypted or not a filesystem layer)"
            )
    config_data = parse_json(_checked_bytes(layout, config, image=image), what="the image config", image=image)
    return LayoutImage(manifest, config, config_data, layers)


def _entry(layout: Path, tag: str | None, *, image: str) -> Descriptor:
    try:
        raw = (layout / "index.json").read_bytes()
    except OSError as exc:
        raise ImageError(
            f"image {image}: no OCI layout at {layout} ({exc.strerror}); make one with "
            f"`skopeo copy docker://IMAGE oci:{layout}:TAG` or `umoci init --layout {layout}`"
        ) from None
    entries = parse_json(raw, what=f"{layout}/index.json", image=image).get("manifests") or []
    if not isinstance(entries, list):
        raise _malformed(image, f"{layout}/index.json has no manifests list")
    if tag is None:
        if len(entries) != 1:
            raise ImageError(
                f"image {image}: the layout {layout} holds {len(entries)} images; name one as oci:PATH:TAG"
            )
        return Descriptor.from_json(entries[0], what="the layout's only entry", image=image)
    for entry in entries:
        annotations = entry.get("annotations") if isinstance(entry, dict) else None
        if isinstance(annotations, dict) and annotations.get(REF_NAME) == tag:
            return Descriptor.from_json(entry, what=f"the layout entry {tag!r}", image=image)
    raise ImageError(f"image {image}: the layout {layout} has no image tagged {tag!r}")


def _parse_manifest(layout: Path, manifest: Descriptor, *, image: str) -> tuple[Descriptor, tuple[Descriptor, ...]]:
    if manifest.media_type and manifest.media_type not in MANIFEST_TYPES:
        raise _malformed(image, f"the layout entry is a {manifest.media_type!r}, not an image manifest")
    data = parse_json(_checked_bytes(layout, manifest, image=image), what="the image manifest", image=image)
    config = Descriptor.from_json(data.get("config"), what="the manifest's config", image=image)
    found = data.get("layers")
    if not isinstance(found, list):
        raise _malformed(image, "the manifest has no layers list")
    layers = tuple(Descriptor.from_json(d, what=f"layer {i}", image=image) for i, d in enumerate(found, 1))
    return config, layers


def _checked_bytes(layout: Path, blob: Descriptor, *, image: str) -> bytes:
    if blob.size > _MAX_JSON_BYTES:
        raise _malformed(image, f"{blob.digest} claims {blob.size} bytes, too large for a manifest or config")
    path = blob_path(layout, blob.digest)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImageError(
            f"image {image}: blob {blob.digest} is missing from {layout} ({exc.strerror}); fetch again"
        ) from None
    if len(data) != blob.size or _sha256(data) != blob.digest:
        raise ImageError(
            f"image {image}: blob {blob.digest} at {path} differs from its digest; delete it and fetch again"
        )
    return data


def _intact(layout: Path, blob: Descriptor) -> bool:
    path = blob_path(layout, blob.digest)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != blob.size:
        return False
    return "sha256:" + file_sha256(path) == blob.digest


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _malformed(image: str, what: str) -> ImageError:
    return ImageError(f"image {image} is malformed: {what}; build and push it again")
