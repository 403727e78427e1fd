"""Unpacking one OCI layer blob into a layer tree in overlayfs format.

The blob is a tar, gzip-compressed or not (zstd through the ``zstd`` CLI; see
:mod:`layerstream`), read as a stream. OCI whiteouts become what overlayfs reads (see
``sandboxd/verifier/lookup.c``): ``.wh.NAME`` a 0/0 character device NAME (which unprivileged
processes may create since Linux 5.8), ``.wh..wh..opq`` the ``overlay.opaque``
xattr on its folder, in the ``trusted.`` namespace in root mode and ``user.``
in rootless mode, where the daemon mounts with ``userxattr``. A whiteout is
placed after the rest of the layer, and only where the layer has no entry of
its own, since it hides lower layers only.

Layers come from anywhere, so every member is written relative to directory
descriptors opened one component at a time with ``O_NOFOLLOW``: ``..``
components, parents that are symlinks or files, and hard links to anything but
a file earlier in the layer are refused (the layer is malformed or hostile);
absolute names land inside; no path length limit applies. Owners stay numeric as the tar has them (root mode only; the
caller shifts them with :func:`~pool.backends.local.store.layers.shift_owners`);
modes keep their set-id and sticky bits; device nodes other than whiteouts are
skipped (a sandbox's ``/dev`` is its own); runs of zeros become holes. Extended
attributes in the tar (file capabilities) are not restored: shifting owners
would clear them anyway. The uncompressed tar is hashed as it is read and must
equal the image config's ``diff_id``.
"""

from __future__ import annotations

import errno
import gzip
import io
import lzma
import os
import stat
import tarfile
import zlib
from pathlib import Path
from typing import IO

from pool.backends.local.oci.layerstream import Hashing, uncompressed
from pool.backends.local.store import walk
from pool.backends.local.store.layers import remove_tree
from pool.errors import ImageError

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
_BLOCK = 1 << 16
_ZERO = bytes(_BLOCK)
_FULL = (errno.ENOSPC, errno.EDQUOT)


def unpack_layer(blob: Path, dest: Path, *, rootless: bool, diff_id: str | None = None, image: str = "") -> None:
    """Unpack a layer blob into the empty folder ``dest``, in overlayfs format.

    Args:
        blob: the layer blob (tar, tar+gzip or tar+zstd).
        dest: an empty folder, e.g. a store staging folder.
        rootless: write opaque markers in the ``user.`` xattr namespace, and keep this
            process as the owner of everything (root mode sets the tar's numeric owners).
        diff_id: the ``sha256:...`` the uncompressed tar must have (from the image config).
        image: the image the layer belongs to, for messages.

    Raises:
        ImageError: the blob is not a (compressed) tar, a member would escape ``dest`` or
            cannot be written, or the tar differs from ``diff_id``.
        UnsupportedError: a zstd layer and no ``zstd`` CLI.
        OSError: ENOSPC or EDQUOT (a store's staging turns them into StoreFullError).
    """
    what = f"layer {blob.name[:19]}" + (f" of image {image}" if image else "")
    unpacker = _Unpacker(dest, rootless=rootless, what=what)
    try:
        with uncompressed(blob, what) as stream:
            hashing = Hashing(stream)
            reader = io.BufferedReader(hashing, buffer_size=1 << 20)
            with tarfile.open(fileobj=reader, mode="r|") as tar:
                while (member := tar.next()) is not None:
                    tar.members.clear()  # type: ignore[attr-defined]  # a stream needs no index of past members
                    unpacker.add(tar, member)
            unpacker.finish()
            while reader.read(1 << 20):  # the padding after the end marker is part of the diff_id
                pass
    except ImageError:
        raise  # (a ValueError too, like the one below)
    except (tarfile.TarError, gzip.BadGzipFile, lzma.LZMAError, EOFError, zlib.error) as exc:
        raise ImageError(
            f"{what} is not a valid tar or compressed tar ({exc}): the blob is damaged; fetch the image again"
        ) from None
    except OSError as exc:
        if exc.errno in _FULL:
            raise
        raise ImageError(
            f"{what}: cannot write {unpacker.current!r} ({exc.strerror}); the layer is malformed"
        ) from None
    except ValueError as exc:  # a name with a NUL byte
        raise ImageError(f"{what}: cannot write {unpacker.current!r} ({exc}); the layer is malformed") from None
    finally:
        unpacker.close()
    if diff_id is not None and hashing.digest() != diff_id:
        raise ImageError(
            f"{what}: its uncompressed tar has digest {hashing.digest()}, not the image config's diff_id {diff_id}; "
            "the blob or the config is damaged: fetch the image again"
        )


class _Unpacker:
    """Writes tar members under a root folder through directory descriptors, following no link."""

    def __init__(self, dest: Path, *, rootless: bool, what: str) -> None:
        self.root_fd = os.open(dest, walk.O_DIR)
        self.what = what
        self.opaque_xattr = ("user" if rootless else "trusted") + ".overlay.opaque"
        self.owners = os.geteuid() == 0 and not rootless
        self.whiteouts: list[tuple[tuple[str, ...], str]] = []
        self.opaque: list[tuple[str, ...]] = []
        self.dirs: dict[tuple[str, ...], tarfile.TarInfo] = {}
        self.current = ""

    def close(self) -> None:
        os.close(self.root_fd)

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        """Write one member (a whiteout is noted for :meth:`finish`)."""
        self.current = member.name[:200]
        parts = self._parts(member.name)
        if parts and parts[-1].startswith(WHITEOUT_PREFIX):
            self._note_whiteout(parts)
        elif not parts:
            if member.isdir():
                self.dirs[()] = member  # the layer's root folder: its mode and owner
        elif not _is_device(member) or _is_whiteout_device(member):  # devices: the sandbox has its own /dev
            parent = self._open_dir(parts[:-1], create=True)
            try:
                self._write(tar, member, parent, parts)
            finally:
                os.close(parent)

    def finish(self) -> None:
        """Place opaque markers and whiteouts, then set folders' modes, owners and times, deepest first."""
        for folder in self.opaque:
            self.current = "/".join((*folder, OPAQUE_MARKER))
            fd = self._open_dir(folder, create=True)
            try:
                os.setxattr(fd, self.opaque_xattr, b"y")
            finally:
                os.close(fd)
        for folder, name in self.whiteouts:
            self.current = "/".join((*folder, WHITEOUT_PREFIX + name))
            fd = self._open_dir(folder, create=True)
            try:
                if not _exists(fd, name):  # the layer's own entry wins: a whiteout hides lower layers only
                    os.mknod(name, stat.S_IFCHR, os.makedev(0, 0), dir_fd=fd)
            finally:
                os.close(fd)
        for parts in sorted(self.dirs, key=len, reverse=True):
            self.current = "/".join(parts)
            try:
                fd = self._open_dir(parts, create=False)
            except (FileNotFoundError, ImageError):
                continue  # replaced by a later member
            try:
                self._set_attrs(fd, self.dirs[parts])
            finally:
                os.close(fd)

    # -- members ----------------------------------------------------------------

    def _write(self, tar: tarfile.TarFile, member: tarfile.TarInfo, parent: int, parts: tuple[str, ...]) -> None:
        name = parts[-1]
        if member.isdir():
            if not _is_dir(parent, name):
                _clear(parent, name)
                os.mkdir(name, 0o700, dir_fd=parent)  # writable until finish() sets its mode
            self.dirs[parts] = member
            return
        _clear(parent, name)  # a later member replaces an earlier one at the same path
        self.dirs.pop(parts, None)
        if member.isreg():
            self._write_file(tar, member, parent, name)
        elif member.issym():
            os.symlink(member.linkname, name, dir_fd=parent)
            self._set_link_attrs(member, parent, name)
        elif member.islnk():
            self._hard_link(member, parent, name)
        elif member.ischr():  # a 0/0 device: already a whiteout
            os.mknod(name, stat.S_IFCHR, os.makedev(0, 0), dir_fd=parent)
        elif member.isfifo():
            os.mkfifo(name, 0o600, dir_fd=parent)
            if self.owners:
                os.chown(name, member.uid, member.gid, dir_fd=parent, follow_symlinks=False)
            os.chmod(name, member.mode & 0o7777, dir_fd=parent)  # just made here, in a private folder
            os.utime(name, ns=_times(member), dir_fd=parent, follow_symlinks=False)

    def _write_file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, parent: int, name: str) -> None:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
        try:
            source = tar.extractfile(member)
            if source is not None:
                _copy_sparse(source, fd)
            os.ftruncate(fd, member.size)
            self._set_attrs(fd, member)
        finally:
            os.close(fd)

    def _hard_link(self, member: tarfile.TarInfo, parent: int, name: str) -> None:
        target = self._parts(member.linkname)
        try:
            if not target:
                raise FileNotFoundError
            target_dir = self._open_dir(target[:-1], create=False)
            try:
                os.link(target[-1], name, src_dir_fd=target_dir, dst_dir_fd=parent, follow_symlinks=False)
            finally:
                os.close(target_dir)
        except (FileNotFoundError, PermissionError):
            raise ImageError(
                f"{self.what}: {member.name!r} is a hard link to {member.linkname!r}, which is not a file earlier "
                "in the layer; the layer is malformed or hostile"
            ) from None

    def _set_attrs(self, fd: int, member: tarfile.TarInfo) -> None:
        if self.owners:
            os.fchown(fd, member.uid, member.gid)  # before chmod: chown clears set-id bits
        os.fchmod(fd, member.mode & 0o7777)
        os.utime(fd, ns=_times(member))

    def _set_link_attrs(self, member: tarfile.TarInfo, parent: int, name: str) -> None:
        if self.owners:
            os.chown(name, member.uid, member.gid, dir_fd=parent, follow_symlinks=False)
        os.utime(name, ns=_times(member), dir_fd=parent, follow_symlinks=False)

    # -- paths ------------------------------------------------------------------

    def _parts(self, name: str) -> tuple[str, ...]:
        parts = tuple(part for part in name.split("/") if part not in ("", "."))
        if ".." in parts:
            raise ImageError(f"{self.what}: {name[:200]!r} climbs out of the layer with '..'; the layer is hostile")
        return parts

    def _note_whiteout(self, parts: tuple[str, ...]) -> None:
        name = parts[-1]
        if name == OPAQUE_MARKER:
            self.opaque.append(parts[:-1])
        elif not name.startswith(WHITEOUT_PREFIX * 2):  # .wh..wh.* other than opq: AUFS bookkeeping
            self.whiteouts.append((parts[:-1], name[len(WHITEOUT_PREFIX) :]))

    def _open_dir(self, parts: tuple[str, ...], *, create: bool) -> int:
        """A descriptor of the folder at ``parts``, opened (and made, if ``create``) component by component."""
        return walk.descend(self.root_fd, parts, lambda fd, part: self._open_child(fd, part, create=create))

    def _open_child(self, fd: int, part: str, *, create: bool) -> int:
        try:
            return os.open(part, walk.O_DIR, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise ImageError(
                f"{self.what}: {self.current!r} goes through {part!r}, which is a symlink or a file in the layer; "
                "the layer is malformed or hostile"
            ) from None
        os.mkdir(part, 0o755, dir_fd=fd)  # a folder the tar uses but does not list
        child = os.open(part, walk.O_DIR, dir_fd=fd)
        os.fchmod(child, 0o755)  # whatever the umask
        return child


def _is_device(member: tarfile.TarInfo) -> bool:
    return member.ischr() or member.isblk()  # (tarfile's isdev() counts FIFOs too; they are kept)


def _is_whiteout_device(member: tarfile.TarInfo) -> bool:
    return member.ischr() and member.devmajor == 0 and member.devminor == 0


def _exists(fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _is_dir(fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _clear(fd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        remove_tree(Path(f"/proc/self/fd/{fd}/{name}"))
    else:
        os.unlink(name, dir_fd=fd)


def _copy_sparse(source: IO[bytes], fd: int) -> None:
    """Copy a member's bytes, leaving blocks of zeros as holes (the caller truncates to the size)."""
    offset = 0
    while chunk := source.read(_BLOCK):
        if chunk != _ZERO[: len(chunk)]:
            view = memoryview(chunk)
            while view:
                written = os.pwrite(fd, view, offset)
                view = view[written:]
                offset += written
        else:
            offset += len(chunk)


def _times(member: tarfile.TarInfo) -> tuple[int, int]:
    ns = int(member.mtime * 1_000_000_000)
    return ns, ns
