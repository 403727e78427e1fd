"""Files out of a registry image, read on the host: :func:`image_files`, for ``COPY --from=<image>``
on backends whose provider cannot copy between images (the cloud backends).

The image is copied with skopeo into a private OCI layout (by the digest resolved first, so what is
read is what was resolved) and its layers are read bottom to top, whiteouts applied, keeping only
what lies under the paths asked for. The result is one tar stream with the names rewritten to the
destinations, which the build sandbox unpacks with ``tar`` in one command.
"""

from __future__ import annotations

import io
import json
import posixpath
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pool.build.registry.settings import RegistrySettings
from pool.build.registry.skopeo import Skopeo
from pool.build.registry.source import parse_source
from pool.errors import BuildError

_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"


@dataclass(frozen=True, slots=True)
class Found:
    """What one source path of an image is."""

    source: str
    is_dir: bool


def image_files(image: str, digest: str, sources: Sequence[str], settings: RegistrySettings) -> tuple[
        dict[str, tuple[tarfile.TarInfo, bytes]], list[Found]]:  # fmt: skip
    """Every entry of ``image`` (pinned to ``digest``) at or under ``sources``, by absolute path, with
    what each source is.

    Raises:
        BuildError: a source is not in the image.
        ImageError: the image cannot be copied.
    """
    src = parse_source(image)
    with tempfile.TemporaryDirectory(prefix="snapgym-copy-from-") as tmp:
        folder = Path(tmp)
        skopeo = Skopeo(settings, tmp_dir=folder)
        skopeo.copy(src.at_digest(digest), f"oci:{folder / 'layout'}:image", image=src.text, host=src.host)
        entries: dict[str, tuple[tarfile.TarInfo, bytes]] = {}
        for blob in _layers(folder / "layout"):
            added: dict[str, tuple[tarfile.TarInfo, bytes]] = {}
            with tarfile.open(blob, "r:*") as layer:
                for member in layer:  # a layer's whiteouts hide what is below it, never its own entries
                    _apply(entries, added, layer, member, sources)
            entries.update(added)
    found = []
    for source in sources:
        entry = entries.get(_absolute(source))
        if entry is None:
            raise BuildError(f"COPY --from={image}: {source} is not in the image")
        found.append(Found(source, entry[0].isdir()))
    return entries, found


def placed(entries: dict[str, tuple[tarfile.TarInfo, bytes]], moves: Sequence[tuple[str, str]],
           mode: int | None) -> bytes:  # fmt: skip
    """A tar of ``entries`` with each ``(source, target)`` of ``moves`` renamed: a folder source's
    contents go into ``target``, a file source becomes ``target`` (names relative to /)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for source, target in moves:
            source = _absolute(source)
            for path, (info, data) in sorted(entries.items()):
                if path != source and not path.startswith(source.rstrip("/") + "/"):
                    continue
                renamed = posixpath.join(target, posixpath.relpath(path, source)) if path != source else target
                copy = tarfile.TarInfo(posixpath.normpath(renamed).lstrip("/") or ".")
                copy.type, copy.linkname, copy.size = info.type, info.linkname, len(data)
                copy.mode = mode if mode is not None and not info.isdir() else info.mode
                copy.uid = copy.gid = 0
                copy.mtime = info.mtime
                tar.addfile(copy, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def _layers(layout: Path) -> list[Path]:
    """The layout's one image's layer blobs, bottom first."""
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(_blob(layout, index["manifests"][0]["digest"]).read_text())
    return [_blob(layout, layer["digest"]) for layer in manifest["layers"]]


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


def _apply(below: dict[str, tuple[tarfile.TarInfo, bytes]], added: dict[str, tuple[tarfile.TarInfo, bytes]],
           layer: tarfile.TarFile, member: tarfile.TarInfo, sources: Sequence[str]) -> None:  # fmt: skip
    """Apply one member of a layer: a whiteout removes from ``below``, an entry under a source goes to ``added``."""
    path = _absolute(member.name)
    parent, name = posixpath.split(path)
    if name == _OPAQUE:
        for key in [k for k in below if k.startswith(parent.rstrip("/") + "/")]:
            del below[key]
        return
    if name.startswith(_WHITEOUT):
        gone = posixpath.join(parent, name[len(_WHITEOUT) :])
        for key in [k for k in below if k == gone or k.startswith(gone + "/")]:
            del below[key]
        return
    if not any(_within(path, _absolute(source)) for source in sources):
        return
    data = b""
    if member.isreg():
        extracted = layer.extractfile(member)
        data = extracted.read() if extracted is not None else b""
    elif member.islnk():  # a hard link: a copy of what it links to, read earlier in this layer or below
        target = _absolute(member.linkname)
        if (linked := added.get(target) or below.get(target)) is not None:
            original, data = linked
            member = tarfile.TarInfo(member.name)
            member.type, member.mode, member.mtime = tarfile.REGTYPE, original.mode, original.mtime
    added[path] = (member, data)


def _absolute(name: str) -> str:
    """A tar member's name as an absolute path (``./etc/x``, ``etc/x`` and ``/etc/x`` are ``/etc/x``)."""
    return "/" + posixpath.normpath("/" + name).lstrip("/")


def _within(path: str, source: str) -> bool:
    return path == source or path.startswith(source.rstrip("/") + "/")
