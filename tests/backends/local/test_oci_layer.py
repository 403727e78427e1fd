"""Unpacking one OCI layer into overlayfs format: whiteouts, opaque folders, links, modes, hostile tars."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from pool.backends.local.oci.layer import unpack_layer
from pool.errors import ImageError
from tests.support.fixtures.oci_fixtures import Entry, write_tar
from tests.support.needs import skip_missing

D, L, S = tarfile.DIRTYPE, tarfile.LNKTYPE, tarfile.SYMTYPE
IS_ROOT = os.geteuid() == 0


def diff_id(tar: Path) -> str:
    return "sha256:" + hashlib.sha256(tar.read_bytes()).hexdigest()


def unpack(tmp_path: Path, entries: list[Entry], *, rootless: bool = False, name: str = "layer") -> Path:
    tar = write_tar(tmp_path / f"{name}.tar", entries)
    dest = tmp_path / name
    dest.mkdir()
    unpack_layer(tar, dest, rootless=rootless, diff_id=diff_id(tar), image="test")
    return dest


def is_whiteout(path: Path) -> bool:
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(0, 0)


@pytest.mark.parametrize("rootless", [False, True], ids=["root", "rootless"])
def test_whiteouts_and_opaque_folders(tmp_path: Path, rootless: bool) -> None:
    if not rootless and not IS_ROOT:
        skip_missing("trusted.* xattrs need root")
    tree = unpack(
        tmp_path,
        [
            Entry("etc/", kind=D, mode=0o755),
            Entry("etc/.wh.issue"),
            Entry("gone/.wh.deep"),  # the folder is not listed: made for the whiteout
            Entry("doc/", kind=D, mode=0o755),
            Entry("doc/.wh..wh..opq"),
            Entry("doc/only", b"x"),
            Entry("srv/.wh.keep"),
            Entry("srv/keep", b"mine"),  # the layer's own entry wins over its whiteout
            Entry("srv/.wh..wh.plnk"),  # AUFS bookkeeping: ignored
        ],
        rootless=rootless,
    )
    assert is_whiteout(tree / "etc/issue") and is_whiteout(tree / "gone/deep")
    namespace = "user" if rootless else "trusted"
    assert os.getxattr(tree / "doc", f"{namespace}.overlay.opaque") == b"y"
    other = "trusted" if rootless else "user"
    with pytest.raises(OSError):
        os.getxattr(tree / "doc", f"{other}.overlay.opaque")
    assert (tree / "doc/only").read_bytes() == b"x"
    assert (tree / "srv/keep").read_bytes() == b"mine"
    assert sorted(os.listdir(tree / "srv")) == ["keep"]
    assert not any(name.startswith(".wh.") for _, dirs, files in os.walk(tree) for name in dirs + files)


def test_modes_owners_links_and_holes(tmp_path: Path) -> None:
    tree = unpack(
        tmp_path,
        [
            Entry("bin/", kind=D, mode=0o755),
            Entry("bin/su", b"#!", mode=0o4755),
            Entry("bin/wall", b"#!", mode=0o2755, gid=5),
            Entry("tmp/", kind=D, mode=0o1777),
            Entry("ro/", kind=D, mode=0o555),
            Entry("ro/inside", b"in a read-only folder", mode=0o444),
            Entry("home/", kind=D, mode=0o755),
            Entry("home/user/", kind=D, mode=0o700, uid=1000, gid=1000),
            Entry("home/user/a", b"linked", uid=1000, gid=1000),
            Entry("home/user/b", kind=L, link="home/user/a", uid=1000, gid=1000),
            Entry("lib", kind=S, link="usr/lib"),
            Entry("abs", kind=S, link="/etc/passwd"),
            Entry("dev/", kind=D, mode=0o755),
            Entry("dev/null", kind=tarfile.CHRTYPE, dev=(1, 3)),
            Entry("dev/sda", kind=tarfile.BLKTYPE, dev=(8, 0)),
            Entry("fifo", kind=tarfile.FIFOTYPE, mode=0o600),
            Entry("sparse", bytes(4 << 20) + b"end"),
        ],
    )
    modes = [stat.S_IMODE(os.lstat(tree / p).st_mode) for p in ("bin/su", "bin/wall", "tmp", "ro", "home/user")]
    assert modes == [
        0o4755,
        0o2755,
        0o1777,
        0o555,
        0o700,
    ]
    assert (tree / "ro/inside").read_bytes() == b"in a read-only folder"
    a, b = os.lstat(tree / "home/user/a"), os.lstat(tree / "home/user/b")
    assert (a.st_ino, a.st_nlink) == (b.st_ino, 2)
    if IS_ROOT:
        assert (a.st_uid, a.st_gid, os.lstat(tree / "bin/wall").st_gid) == (1000, 1000, 5)
    assert os.readlink(tree / "lib") == "usr/lib" and os.readlink(tree / "abs") == "/etc/passwd"
    assert os.listdir(tree / "dev") == []  # device nodes come from the sandbox's own /dev
    assert stat.S_ISFIFO(os.lstat(tree / "fifo").st_mode)
    sparse = os.lstat(tree / "sparse")
    assert sparse.st_size == (4 << 20) + 3 and sparse.st_blocks * 512 < 1 << 20
    assert (tree / "sparse").read_bytes()[-3:] == b"end"
    assert os.lstat(tree / "sparse").st_mtime == 1_700_000_000


def test_later_members_replace_earlier_ones(tmp_path: Path) -> None:
    tree = unpack(
        tmp_path,
        [
            Entry("a", b"file first"),
            Entry("a/", kind=D, mode=0o755),
            Entry("a/x", b"then a folder"),
            Entry("b/", kind=D, mode=0o700),
            Entry("b/y", b"in a folder"),
            Entry("b", b"then a file"),
            Entry("c", b"one"),
            Entry("c", b"two"),
        ],
    )
    assert (tree / "a/x").read_bytes() == b"then a folder"
    assert (tree / "b").read_bytes() == b"then a file"
    assert (tree / "c").read_bytes() == b"two"


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([Entry("../evil", b"x")], "climbs out"),
        ([Entry("a/../../evil", b"x")], "climbs out"),
        ([Entry("link", kind=S, link="/tmp"), Entry("link/planted", b"x")], "goes through 'link'"),
        ([Entry("up", kind=S, link=".."), Entry("up/planted", b"x")], "goes through 'up'"),
        ([Entry("f", b"x"), Entry("f/child", b"x")], "goes through 'f'"),
        ([Entry("h", kind=L, link="../../etc/passwd")], "climbs out"),
        ([Entry("h", kind=L, link="etc/passwd")], "not a file earlier in the layer"),
        ([Entry("d/", kind=D), Entry("h", kind=L, link="d")], "not a file earlier in the layer"),
        ([Entry("n" * 300, b"x")], "cannot write"),
    ],
    ids=[
        "dotdot",
        "dotdot-inside",
        "abs-symlink-parent",
        "rel-symlink-parent",
        "file-parent",
        "hardlink-out",
        "hardlink-missing",
        "hardlink-dir",
        "long-name",
    ],
)
def test_hostile_layers_are_refused(tmp_path: Path, entries: list[Entry], message: str) -> None:
    outside = tmp_path / "evil"
    with pytest.raises(ImageError, match=message):
        unpack(tmp_path, entries, name="hostile")
    assert not outside.exists() and not Path("/tmp/planted").exists()


def test_hard_link_to_a_symlink_links_the_symlink_not_its_target(tmp_path: Path) -> None:
    tree = unpack(tmp_path, [Entry("s", kind=S, link="/etc/passwd"), Entry("h", kind=L, link="s")])
    assert os.path.islink(tree / "h") and os.lstat(tree / "h").st_ino == os.lstat(tree / "s").st_ino
    assert os.lstat(tree / "h").st_ino != os.stat("/etc/passwd").st_ino


def test_a_hard_link_to_a_host_file_is_refused(tmp_path: Path) -> None:
    """What layers.extract_rootfs (tarfile's "tar" filter on Python 3.11.7) lets through: a host file linked in."""
    climbing = "../" * 12 + "etc/hostname"
    with pytest.raises(ImageError, match="climbs out"):
        unpack(tmp_path, [Entry("stolen", kind=L, link=climbing)])
    with pytest.raises(ImageError, match="climbs out"):
        unpack(tmp_path, [Entry("stolen", kind=L, link="/" + climbing)], name="absolute")


def test_absolute_names_land_inside(tmp_path: Path) -> None:
    tree = unpack(tmp_path, [Entry("/etc/inside", b"x"), Entry("./etc/./also", b"y")])
    assert sorted(os.listdir(tree / "etc")) == ["also", "inside"]


def test_paths_deeper_than_path_max(tmp_path: Path) -> None:
    parts = [f"{i:03d}" + "d" * 120 for i in range(45)]  # about 5,600 bytes
    entries = [Entry("/".join(parts[: i + 1]) + "/", kind=D, mode=0o755) for i in range(len(parts))]
    entries.append(Entry("/".join([*parts, "leaf"]), b"deep"))
    tree = unpack(tmp_path, entries)
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
        leaf = os.open("leaf", os.O_RDONLY, dir_fd=fd)
        assert os.read(leaf, 10) == b"deep"
        os.close(leaf)
    finally:
        os.close(fd)


def test_compressions_and_the_diff_id(tmp_path: Path) -> None:
    tar = write_tar(tmp_path / "plain.tar", [Entry("a", b"same"), Entry("b/", kind=D), Entry("b/c", b"tree")])
    good = diff_id(tar)
    gz = tmp_path / "layer.tar.gz"
    gz.write_bytes(gzip.compress(tar.read_bytes()))
    blobs = [tar, gz]
    for suffix, compress in (("bz2", bz2.compress), ("xz", lzma.compress)):  # root filesystem tarballs use these
        blobs.append(tmp_path / f"layer.tar.{suffix}")
        blobs[-1].write_bytes(compress(tar.read_bytes()))
    if shutil.which("zstd"):
        subprocess.run(["zstd", "-q", str(tar), "-o", str(tmp_path / "layer.tar.zst")], check=True)
        blobs.append(tmp_path / "layer.tar.zst")
    for index, blob in enumerate(blobs):
        dest = tmp_path / f"out{index}"
        dest.mkdir()
        unpack_layer(blob, dest, rootless=False, diff_id=good)
        assert (dest / "a").read_bytes() == b"same" and (dest / "b/c").read_bytes() == b"tree"

    with pytest.raises(ImageError, match="not the image config's diff_id"):
        (tmp_path / "wrong").mkdir()
        unpack_layer(gz, tmp_path / "wrong", rootless=False, diff_id="sha256:" + "0" * 64)
    damaged = tmp_path / "damaged.tar.gz"
    data = bytearray(gz.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    (tmp_path / "bad").mkdir()
    with pytest.raises(ImageError, match=r"not a valid tar|diff_id"):
        unpack_layer(damaged, tmp_path / "bad", rootless=False, diff_id=good)
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"not a tar at all" * 100)
    (tmp_path / "garbage-out").mkdir()
    with pytest.raises(ImageError, match="not a valid tar"):
        unpack_layer(garbage, tmp_path / "garbage-out", rootless=False)
