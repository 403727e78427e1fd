"""COPY --from reads an image's layers on the host as the overlay shows them, and never leaves them.

The layers are the image author's; a link in them must resolve inside the image, never to the
host's files (an absolute link to /etc, a relative one climbing out, a link in a lower layer
under a folder of an upper one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pool.backends.local.store.layerview import LayerView
from pool.errors import BuildError

ROOTLESS = os.geteuid() != 0


def _layers(tmp_path: Path, n: int) -> list[Path]:
    layers = [tmp_path / f"layer{i}" for i in range(n)]
    for layer in layers:
        layer.mkdir()
    return layers


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _files(view: LayerView, path: str) -> dict[str, str]:
    return {
        e.path: e.host_path.read_text()
        for e in view.walk(path)
        if e.host_path.is_file() and not e.host_path.is_symlink()
    }


def _opaque(folder: Path) -> None:
    os.setxattr(folder, "user.overlay.opaque" if ROOTLESS else "trusted.overlay.opaque", b"y")


def test_the_top_layer_wins_and_whiteouts_and_opaque_folders_hide(tmp_path: Path) -> None:
    """A file replaced above, one deleted by a whiteout, a folder made opaque: the merged view."""
    low, high = _layers(tmp_path, 2)
    _write(low / "app/a", "low a")
    _write(low / "app/b", "low b")
    _write(low / "app/sub/c", "low c")
    _write(low / "docs/old", "old")
    _write(high / "app/a", "high a")
    os.mknod(high / "app/b", 0o600 | 0o020000, os.makedev(0, 0))
    _write(high / "docs/new", "new")
    _opaque(high / "docs")
    view = LayerView([low, high], rootless=ROOTLESS)
    assert _files(view, "/app") == {"a": "high a", "sub/c": "low c"}
    assert _files(view, "/docs") == {"new": "new"}
    with pytest.raises(BuildError, match="does not exist"):
        list(view.walk("/app/b"))


def test_links_resolve_inside_the_image_never_on_the_host(tmp_path: Path) -> None:
    """/bin -> usr/bin resolves in the image; links to /etc or climbing out name the image's files only."""
    (layer,) = _layers(tmp_path, 1)
    _write(layer / "usr/bin/uv", "uv")
    (layer / "bin").symlink_to("usr/bin")
    (layer / "hostetc").symlink_to("/etc")
    (layer / "climb").symlink_to("../../../../../../../../etc")
    view = LayerView([layer], rootless=ROOTLESS)
    assert _files(view, "/bin/uv") == {"": "uv"}
    assert Path("/etc/hostname").exists() or Path("/etc/passwd").exists()
    for path in ("/hostetc/passwd", "/climb/passwd", "/hostetc/hostname", "/../../etc/passwd"):
        with pytest.raises(BuildError, match="does not exist in the image"):
            list(view.walk(path))


def test_a_link_in_a_lower_layer_under_an_upper_folder_is_not_followed(tmp_path: Path) -> None:
    """A lower layer's /data is a link to the host's /etc, the upper's /data a real folder: the lower
    link must neither show through nor be followed on the host."""
    low, high = _layers(tmp_path, 2)
    (low / "data").symlink_to("/etc")
    _write(high / "data/mine", "mine")
    view = LayerView([low, high], rootless=ROOTLESS)
    assert _files(view, "/data") == {"mine": "mine"}
    with pytest.raises(BuildError, match="does not exist"):
        list(view.walk("/data/passwd"))


def test_a_file_above_hides_a_folder_below(tmp_path: Path) -> None:
    """An upper file where a lower layer has a folder: the folder's contents are gone."""
    low, high = _layers(tmp_path, 2)
    _write(low / "thing/inside", "x")
    _write(high / "thing", "now a file")
    view = LayerView([low, high], rootless=ROOTLESS)
    assert _files(view, "/thing") == {"": "now a file"}
    with pytest.raises(BuildError):
        list(view.walk("/thing/inside"))


def test_a_link_loop_is_an_error(tmp_path: Path) -> None:
    (layer,) = _layers(tmp_path, 1)
    (layer / "a").symlink_to("b")
    (layer / "b").symlink_to("a")
    with pytest.raises(BuildError, match="too many levels"):
        list(LayerView([layer], rootless=ROOTLESS).walk("/a/x"))
