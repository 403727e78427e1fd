"""Where the local backend keeps snapshots and layers, and where it runs.

The store proves what it serves. A snapshot's digest is a chain over its layers:
``combine(seed, base layer digests...)`` for its base (the seed names what the
layers stand on: ``host:<fingerprint>`` or ``rootfs``), then ``combine(parent,
layer digest)`` per layer above. :meth:`SnapshotStore.check` recomputes that
chain from layers checked against their content (see :mod:`layers`), so a
record whose digest was edited, or that names layers it was not made from, is
refused like a damaged layer. Records carry the digest :data:`~pool.build.digest.FORMAT`;
records of another format are treated as absent, so their templates are rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pool.backends.local.store import durable
from pool.backends.local.store.layers import LayerStore, reap_orphans
from pool.build.digest import FORMAT, combine
from pool.errors import SnapshotCorruptError, SnapshotError, SnapshotNotFoundError
from pool.snapshots import Snapshot


def default_store_dir() -> Path:
    """$SNAPGYM_STORE, else $XDG_CACHE_HOME/snapgym, else ~/.cache/snapgym."""
    if env := os.environ.get("SNAPGYM_STORE"):
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "snapgym"


def default_runtime_dir() -> Path:
    """/run/snapgym as root; $XDG_RUNTIME_DIR/snapgym or /tmp/snapgym-UID otherwise."""
    if os.geteuid() == 0:
        return Path("/run/snapgym")
    if xdg := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(xdg) / "snapgym"
    return Path(f"/tmp/snapgym-{os.geteuid()}")


@dataclass(frozen=True, slots=True)
class BaseRecord:
    """A base: the layers a template's setup starts on, and what they stand on."""

    seed: str
    """What the layers stand on (``host:<fingerprint>``, ``rootfs``); the chain's first link."""
    layers: tuple[str, ...]
    digest: str
    """``combine(seed, *layer digests)``."""


class SnapshotStore:
    """Snapshot records (JSON) and the layers they reference."""

    def __init__(self, root: Path, *, id_offset: int, rootless: bool) -> None:
        self.root = root
        self.rootless = rootless
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)  # layers hold files owned by sandbox ids; keep others out
        self._check_mode()
        self.layers = LayerStore(root / "layers", manifests=root / "manifests", id_offset=id_offset)
        self.records = root / "snapshots"
        self.records.mkdir(exist_ok=True)
        self.bases = root / "bases"
        self.bases.mkdir(exist_ok=True)
        (root / "locks").mkdir(exist_ok=True)
        self._checked: set[tuple[str, tuple[str, ...]]] = set()

    def _check_mode(self) -> None:
        # Root mode and rootless mode write overlay metadata in different xattr
        # namespaces, so one store must not serve both.
        # The marker appears whole or not at all (written aside, then linked into place), so a
        # backend opening the store while another creates it never reads it half-written.
        marker = self.root / "MODE"
        mode = "rootless" if self.rootless else "root"
        if not marker.exists():
            draft = self.root / f".MODE.{os.getpid()}.{threading.get_ident()}"
            draft.write_text(mode + "\n")
            try:
                os.link(draft, marker)
            except FileExistsError:
                pass  # another backend made it first: checked below like any existing one
            finally:
                draft.unlink(missing_ok=True)
        found = marker.read_text().strip()
        if found != mode:
            raise SnapshotError(
                f"the snapshot store {self.root} was made in {found} mode and this "
                f"backend runs in {mode} mode; pass store_dir= to use another store"
            )

    # -- records --------------------------------------------------------------

    def find(self, snapshot_id: str) -> Snapshot | None:
        """The snapshot with that id, or None (also for a record of an older format)."""
        data = _read_record(self.records / f"{snapshot_id}.json")
        return None if data is None else Snapshot.from_dict(data)

    def get(self, snapshot_id: str) -> Snapshot:
        """The snapshot with that id, or SnapshotNotFoundError."""
        snap = self.find(snapshot_id)
        if snap is None:
            raise SnapshotNotFoundError(f"no snapshot {snapshot_id!r} in {self.root}; build its template first")
        return snap

    def find_usable(self, snapshot_id: str) -> Snapshot | None:
        """The snapshot, checked; None when it is absent or one of its layers was deleted (rebuild it).

        Raises:
            SnapshotCorruptError: a layer or the record differs from its digest.
        """
        snap = self.find(snapshot_id)
        if snap is None or not all(self.layers.exists(layer) for layer in snap.layers):
            return None
        self.check(snap)
        return snap

    def save(self, snapshot: Snapshot) -> None:
        """Write a snapshot record atomically, durably and read-only."""
        data = json.dumps({"format": FORMAT, **snapshot.to_dict()}, sort_keys=True, indent=1)
        with durable.space_checked(self.root, f"recording snapshot {snapshot.id}"):
            durable.write_file(self.records / f"{snapshot.id}.json", data.encode())

    def all(self) -> list[Snapshot]:
        """Every snapshot in the store, oldest first."""
        found = (_read_record(p) for p in self.records.glob("*.json"))
        return sorted((Snapshot.from_dict(d) for d in found if d is not None), key=lambda s: s.created_at)

    # -- bases ----------------------------------------------------------------

    def find_base(self, name: str) -> BaseRecord | None:
        """The base recorded under ``name``, checked; None when absent, older or missing a layer.

        Raises:
            SnapshotCorruptError: a layer or the record differs from its digest.
        """
        base = _base_from(_read_record(self.bases / f"{name}.json"))
        if base is None or not all(self.layers.exists(layer) for layer in base.layers):
            return None
        if self._base_digest(base, deep=False) != base.digest:
            raise SnapshotCorruptError(
                f"the base record {self.bases / name}.json does not match its layers (it was changed); "
                "delete it and build again"
            )
        return base

    def save_base(self, name: str, base: BaseRecord) -> None:
        """Record a base under ``name`` (atomically, durably, read-only)."""
        data = {"format": FORMAT, "seed": base.seed, "layers": list(base.layers), "digest": base.digest}
        with durable.space_checked(self.root, f"recording base {name}"):
            durable.write_file(self.bases / f"{name}.json", json.dumps(data).encode())

    # -- proof ----------------------------------------------------------------

    def check(self, snapshot: Snapshot, *, deep: bool = False) -> None:
        """Prove that a snapshot's digest is what its layers hold (the first time, or always when ``deep``).

        Raises:
            SnapshotError: a layer is missing.
            SnapshotCorruptError: a layer differs from its digest (naming the layer and
                the first differing path), or the layers verify but chain to another digest.
        """
        for layer_id in snapshot.layers:
            self.layers.require(layer_id)
        key = (snapshot.digest, snapshot.layers)
        if not deep and key in self._checked:
            return
        if self.verified_digest(snapshot, deep=deep) != snapshot.digest:
            raise SnapshotCorruptError(
                f"snapshot {snapshot.id}: its layers are intact but chain to another digest than the "
                f"recorded {snapshot.digest[:16]}; its record ({self.records / snapshot.id}.json) or its "
                "base's record was changed: delete that record and build again"
            )
        self._checked.add(key)

    def verified_digest(self, snapshot: Snapshot, *, deep: bool = False) -> str | None:
        """The digest a snapshot's layers chain to, each checked; None when no base record fits."""
        chained: str | None = None
        for base in self._bases_under(snapshot.layers):
            digest = self._base_digest(base, deep=deep)
            if digest != base.digest:
                continue  # another base record on the same layers, or one that was edited
            for layer_id in snapshot.layers[len(base.layers) :]:
                digest = combine(digest, self.layers.verify(layer_id, deep=deep))
            if digest == snapshot.digest:
                return digest
            chained = digest
        return chained

    def reap(self) -> int:
        """Remove staging folders and files of dead owners anywhere in the store; how many."""
        reaped = self.layers.reap()
        return reaped + reap_orphans(self.records, self.bases)

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """An exclusive lock across processes (two builds of one template)."""
        with open(self.root / "locks" / f"{name}.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _base_digest(self, base: BaseRecord, *, deep: bool) -> str:
        return combine(base.seed, *(self.layers.verify(layer_id, deep=deep) for layer_id in base.layers))

    def _bases_under(self, layers: tuple[str, ...]) -> Iterator[BaseRecord]:
        for path in sorted(self.bases.glob("*.json")):
            base = _base_from(_read_record(path))
            if base is not None and base.layers == layers[: len(base.layers)]:
                yield base


def _read_record(path: Path) -> dict[str, Any] | None:
    """A record's fields (without the format key); None when absent or of another format."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SnapshotError(f"the record {path} is corrupt ({exc}); delete it and build again") from exc
    if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
        return None  # written by an older snapgym: its digests are not comparable
    return data


def _base_from(data: dict[str, Any] | None) -> BaseRecord | None:
    if data is None:
        return None
    try:
        return BaseRecord(str(data["seed"]), tuple(data["layers"]), str(data["digest"]))
    except (KeyError, TypeError):
        return None
