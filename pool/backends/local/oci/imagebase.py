"""Image bases: an OCI image as read-only store layers, shared between images, and a base record.

Each layer of the image becomes one store layer: unpacked in overlayfs format
(:mod:`ocilayer`), owners shifted, committed under its tree digest. A small
record per layer, named by its ``diff_id`` (the digest of the uncompressed tar,
which does not depend on how the blob is compressed), gives the store layer it
became, so a layer that several images share is unpacked and stored once. The
mount-point layer (:mod:`mountpoints`) goes on top.

The base digest is ``combine("oci", d1, ..., dn, dm)``: ``di`` the tree digest
(:mod:`pool.build.digest`) of the image's i-th layer as unpacked, bottom first, and
``dm`` that of the mount-point layer. It depends on the files alone, not on
where the image came from or how its blobs were compressed, so an image gives
the same digest on every machine (in root mode; a rootless store records files
as owned by the user it runs as). A snapshot's digest chains on from it, so it
covers the image's layers.

Caching: the base is recorded under the digest the source resolves to (with
the platform): a registry's manifest or index digest, an ``oci:`` layout's
entry. A source pinned with ``@sha256:`` is then found with no network at all;
a tag costs one manifest request (``skopeo inspect``), so a moved tag is
noticed, and nothing is copied when its digest is stored. Archives and the
Docker engine are copied into the fetch cache each time (blobs already there
are not written again), and their layers are found in the store by diff_id.
The image's config (env, workdir, user, entrypoint, cmd) is kept beside the
base record, so a cache hit returns it too.

Offline: each time a source resolves, the digest it named is recorded under the source (with the
platform). When the registry and its mirrors cannot be reached (only then: a refusal or a missing
image still fails), a source resolved before is used at the digest it named then, if that base is
stored, and a warning says so: a stored suite starts with no registry at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from pool.backends.local.oci.fetch import ImageFetcher, LayerBlob, PulledImage
from pool.backends.local.oci.layer import unpack_layer
from pool.backends.local.store import durable
from pool.backends.local.store.catalogue import BaseRecord, SnapshotStore
from pool.backends.local.store.layers import reap_orphans, shift_owners
from pool.backends.local.store.mountpoints import mount_point_layer
from pool.build.digest import FORMAT, combine
from pool.build.registry.imageconfig import ImageConfig
from pool.errors import RegistryUnreachableError

log = logging.getLogger(__name__)

SEED = "oci"
"""The first link of an image base's digest: the content is all in the layers."""


def image_base(store: SnapshotStore, source: str, *, fetcher: ImageFetcher) -> tuple[BaseRecord, ImageConfig]:
    """The base of an image source and its config: from the store when recorded, else fetched and unpacked.

    Owners are shifted by the store's ``id_offset``; opaque markers use the store's
    mode (rootless: ``user.`` xattrs).

    Raises:
        ConfigError: not an image source.
        ImageError: the image cannot be fetched, verified or unpacked (the message says how to provide it).
        SnapshotCorruptError: a stored layer differs from its digest.
        StoreFullError: the store's filesystem is full.
        UnsupportedError: skopeo (or, for a zstd layer, zstd) is missing.
    """
    platform = fetcher.settings.platform
    try:
        resolved = fetcher.resolve(source)
    except RegistryUnreachableError as exc:
        earlier = _last_resolved(store, source, platform)
        if earlier is None or (found := cached_base(store, earlier, platform=platform)) is None:
            raise
        log.warning("image %s: the registry cannot be reached (%s); using %s, which it named when last reached "
                    "(stored here)", source, exc, earlier)  # fmt: skip
        return found
    if resolved is not None:
        _remember(store, source, platform, resolved)
        if found := cached_base(store, resolved, platform=platform):
            return found
    return pulled_base(store, fetcher.fetch(source))


def _tag_path(store: SnapshotStore, source: str, platform: str) -> Path:
    return _folder(store, "resolved") / f"{_image_key(source, platform)}.json"


def _remember(store: SnapshotStore, source: str, platform: str, resolved: str) -> None:
    """Record the digest ``source`` named now (for a run without the registry later)."""
    path = _tag_path(store, source, platform)
    known = _read(path)
    if known is None or known.get("resolved") != resolved:
        _write(store, path, {"source": source, "platform": platform, "resolved": resolved})


def _last_resolved(store: SnapshotStore, source: str, platform: str) -> str | None:
    data = _read(_tag_path(store, source, platform))
    found = data.get("resolved") if data else None
    return found if isinstance(found, str) else None


def cached_base(store: SnapshotStore, resolved: str, *, platform: str) -> tuple[BaseRecord, ImageConfig] | None:
    """The recorded base and config of the image with that resolved digest, checked; None when not recorded.

    Raises:
        SnapshotCorruptError: a layer of the base differs from its digest.
    """
    key = _image_key(resolved, platform)
    record = store.find_base(f"oci-{key}")
    data = _read(_folder(store, "images") / f"{key}.json")
    if record is None or data is None or not isinstance(data.get("config"), dict):
        return None
    return record, ImageConfig.from_dict(data["config"])


def pulled_base(store: SnapshotStore, image: PulledImage) -> tuple[BaseRecord, ImageConfig]:
    """The base of a fetched image: its layers in the store (each unpacked once) and the mount-point layer."""
    key = _image_key(image.resolved_digest, image.platform)
    with store.lock(f"oci-{key}"):
        if found := cached_base(store, image.resolved_digest, platform=image.platform):
            return found
        _reap(store)
        unpacked = [_layer(store, blob, image.source) for blob in image.layers]
        mounts_id, mounts_digest = mount_point_layer(store.layers, below=[store.layers.path(i) for i, _ in unpacked])
        layer_ids = (*(layer_id for layer_id, _ in unpacked), mounts_id)
        digest = combine(SEED, *(d for _, d in unpacked), mounts_digest)
        record = BaseRecord(SEED, layer_ids, digest)
        store.save_base(f"oci-{key}", record)
        _write(
            store,
            _folder(store, "images") / f"{key}.json",
            {
                "source": image.source,
                "resolved": image.resolved_digest,
                "manifest": image.manifest_digest,
                "config_digest": image.config_digest,
                "platform": image.platform,
                "config": image.config.to_dict(),
            },
        )
    return record, image.config


def _layer(store: SnapshotStore, blob: LayerBlob, image: str) -> tuple[str, str]:
    """The store layer (id, digest) an OCI layer unpacks to: recorded by diff_id, else unpacked now."""
    name = blob.diff_id.removeprefix("sha256:")
    path = _folder(store, "layers") / f"{name}.json"
    if known := _known_layer(store, path):
        return known
    with store.lock(f"oci-layer-{name[:32]}"):  # two images sharing it, built at once: one unpacks
        if known := _known_layer(store, path):
            return known
        with store.layers.staging(f"unpacking layer {blob.digest} of {image}") as staged:
            unpack_layer(blob.path, staged, rootless=store.rootless, diff_id=blob.diff_id, image=image)
            shift_owners(staged, store.layers.id_offset)
            layer_id, digest = store.layers.commit(staged)
        _write(store, path, {"layer": layer_id, "digest": digest, "blob": blob.digest})
    return layer_id, digest


def _known_layer(store: SnapshotStore, path: Path) -> tuple[str, str] | None:
    data = _read(path)
    if data is None:
        return None
    layer_id, digest = data.get("layer"), data.get("digest")
    if not isinstance(layer_id, str) or not isinstance(digest, str) or not store.layers.exists(layer_id):
        return None
    if store.layers.verify(layer_id) != digest:
        return None  # the record was edited: unpack again (a damaged layer raises in verify)
    return layer_id, digest


def _image_key(resolved: str, platform: str) -> str:
    return hashlib.sha256(f"{resolved}\0{platform}".encode()).hexdigest()[:32]


def _folder(store: SnapshotStore, name: str) -> Path:
    folder = store.root / "oci" / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _read(path: Path) -> dict[str, Any] | None:
    """A record's fields; None when absent, unreadable or of another digest format (it is then made again)."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
        return None
    return data


def _write(store: SnapshotStore, path: Path, data: dict[str, Any]) -> None:
    with durable.space_checked(store.root, f"recording {path.name}"):
        durable.write_file(path, json.dumps({"format": FORMAT, **data}, sort_keys=True).encode())


def _reap(store: SnapshotStore) -> None:
    """Remove record files that processes killed mid-write left (the store's reap does not know these folders)."""
    reap_orphans(_folder(store, "images"), _folder(store, "layers"), _folder(store, "resolved"))
