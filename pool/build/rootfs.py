"""A template base that is a root filesystem on this machine: a folder or a tarball.

Every backend that can start from one finds it the same way (``~`` expanded, refused with the
fix when it is not there) and names its cached base after the same cheap key
(:func:`pool.build.digest.source_key`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pool.build.digest import source_key
from pool.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RootfsSource:
    """A root filesystem folder or tarball a template names as its base."""

    path: Path
    key: str
    """Its :func:`~pool.build.digest.source_key`: what its cached base is named after."""

    @classmethod
    def find(cls, spec: str, *, other_bases: Sequence[str]) -> RootfsSource:
        """The root filesystem ``spec`` names.

        Args:
            spec: the template's base, a path (``~`` allowed).
            other_bases: what else the backend reads a base as, for the message (``"'host'"``, ...).

        Raises:
            ConfigError: no such folder or file; says how to make one.
        """
        path = Path(spec).expanduser()
        if not path.exists():
            listed = ", ".join(other_bases) + ("," if len(other_bases) > 1 else "")
            raise ConfigError(
                f"template base {spec!r} is neither {listed} nor an existing root filesystem directory "
                "or tarball (make one with: docker export CONTAINER > rootfs.tar)"
            )
        return cls(path, source_key(path))

    @property
    def name(self) -> str:
        """The cached base's name: ``rootfs-`` and the key's first 32 digits."""
        return f"rootfs-{self.key[:32]}"

    @property
    def identity(self) -> str:
        """What a snapshot's identity is taken over for this base."""
        return f"rootfs:{self.key}"
