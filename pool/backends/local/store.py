"""Where the local backend keeps snapshots and layers, and where it runs."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from pool.backends.local.layers import LayerStore
from pool.errors import SnapshotError, SnapshotNotFoundError
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


class SnapshotStore:
    """Snapshot records (JSON) and the layers they reference."""

    def __init__(self, root: Path, *, id_offset: int, rootless: bool) -> None:
        self.root = root
        self.rootless = rootless
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)  # layers hold files owned by sandbox ids; keep others out
        self._check_mode()
        self.layers = LayerStore(root / "layers", id_offset=id_offset)
        self.records = root / "snapshots"
        self.records.mkdir(exist_ok=True)
        self.bases = root / "bases"
        self.bases.mkdir(exist_ok=True)
        (root / "locks").mkdir(exist_ok=True)

    def _check_mode(self) -> None:
        # Root mode and rootless mode write overlay metadata in different xattr
        # namespaces, so one store must not serve both.
        marker = self.root / "MODE"
        mode = "rootless" if self.rootless else "root"
        if not marker.exists():
            marker.write_text(mode + "\n")
        elif marker.read_text().strip() != mode:
            raise SnapshotError(
                f"the snapshot store {self.root} was made in {marker.read_text().strip()} mode and this "
                f"backend runs in {mode} mode; pass store_dir= to use another store"
            )

    def find(self, snapshot_id: str) -> Snapshot | None:
        """The snapshot with that id, or None."""
        path = self.records / f"{snapshot_id}.json"
        try:
            return Snapshot.from_json(path.read_text())
        except FileNotFoundError:
            return None

    def get(self, snapshot_id: str) -> Snapshot:
        """The snapshot with that id, or SnapshotNotFoundError."""
        snap = self.find(snapshot_id)
        if snap is None:
            raise SnapshotNotFoundError(f"no snapshot {snapshot_id!r} in {self.root}; build its template first")
        return snap

    def save(self, snapshot: Snapshot) -> None:
        """Write a snapshot record atomically."""
        path = self.records / f"{snapshot.id}.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(snapshot.to_json())
        os.replace(tmp, path)

    def all(self) -> list[Snapshot]:
        """Every snapshot in the store, oldest first."""
        snaps = [Snapshot.from_json(p.read_text()) for p in self.records.glob("*.json")]
        return sorted(snaps, key=lambda s: s.created_at)

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """An exclusive lock across processes (two builds of one template)."""
        with open(self.root / "locks" / f"{name}.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
