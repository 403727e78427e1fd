"""The store proves what it serves: durable read-only records, layers checked before use,
sparse files, size limits, deep trees, hard links, and nothing left by interrupted snapshots.

Tests that damage a store make their own (a copy of the session store's compiled daemon
keeps that quick); the others share one module store.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pool import LocalBackend, Snapshot, Template
from pool.backends.local.store import durable, layers, manifest, treecopy
from pool.backends.local.store.layers import LayerStore
from pool.build import digest
from pool.errors import SnapshotCorruptError, SnapshotTooLargeError, StoreFullError

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE = Template(
    name="integrity",
    setup=["echo hi > a", "mkdir -p src && echo 'print(1)' > src/main.py", "ln -s a link"],
    workdir="/workspace",
)
OTHER = Template(name="integrity-other", setup=["echo other > o"], workdir="/workspace")
OPTIONS = {"memory_limit_mb": 256, "pids_limit": 128, "disk_limit_mb": 64}
DEPTH = 2000


def new_store(path: Path, session_store: Path) -> Path:
    """An empty store that already holds the compiled sandbox daemon."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copytree(session_store / "bin", path / "bin")
    return path


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, store_dir: Path, snap: Snapshot) -> Iterator[LocalBackend]:
    root = new_store(tmp_path_factory.mktemp("integrity"), store_dir)
    with LocalBackend(store_dir=root, **OPTIONS) as b:
        yield b
    layers.remove_tree(root)  # it holds a 2,000-level tree, which pytest's recursive cleanup cannot remove


@pytest.fixture()
def built(tmp_path: Path, store_dir: Path, snap: Snapshot) -> tuple[Path, Snapshot]:
    """A store of one's own with TEMPLATE built in it (by a backend already closed)."""
    root = new_store(tmp_path / "store", store_dir)
    with LocalBackend(store_dir=root, **OPTIONS) as b:
        return root, b.build(TEMPLATE)


def top_layer(root: Path, snap: Snapshot) -> Path:
    return root / "layers" / snap.layers[-1]


def staging_entries(root: Path) -> list[Path]:
    return [p for d in ("layers", "manifests", "snapshots", "bases") for p in (root / d).iterdir() if p.name[0] == "."]


# -- 1. durable, read-only records ---------------------------------------------------


def test_records_and_manifests_are_fsynced_and_read_only(
    tmp_path: Path, store_dir: Path, snap: Snapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync, real_syncfs = os.fsync, durable.sync_filesystem
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    monkeypatch.setattr(durable, "sync_filesystem", lambda p: (synced.append(f"syncfs {p}"), real_syncfs(p)))
    root = new_store(tmp_path / "store", store_dir)
    with LocalBackend(store_dir=root, **OPTIONS) as b:
        built = b.build(TEMPLATE)
    record = root / "snapshots" / f"{built.id}.json"
    written = [record, *(root / "bases").glob("*.json"), *(root / "manifests").glob("*.json")]
    assert len(written) == 1 + 1 + len(built.layers)
    assert all(p.stat().st_mode & 0o777 == 0o444 for p in written)
    # Each layer tree before it is renamed into place: the large host base with one syncfs, the
    # template's small layer with an fsync per file and directory.
    assert any(p.startswith("syncfs ") and "/layers/.staging-" in p for p in synced)
    assert any(".staging-" in p and p.endswith("/workspace/src/main.py") for p in synced)
    assert str(root / "snapshots") in synced and any(".staging-" in p and "/snapshots/" in p for p in synced)
    assert json.loads(record.read_text())["format"] == digest.FORMAT


# -- 2. layers are checked before first use ----------------------------------------


def _rewrite_keeping_mtime(path: Path, data: bytes) -> None:
    st = path.stat()
    fd = os.open(path, os.O_WRONLY)
    os.pwrite(fd, data, 0)
    os.close(fd)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: only ctime tells


def test_an_edited_layer_stops_build_create_fork_and_restore(built: tuple[Path, Snapshot]) -> None:
    root, snap = built
    _rewrite_keeping_mtime(top_layer(root, snap) / "workspace" / "a", b"HI\n")
    with LocalBackend(store_dir=root, **OPTIONS) as b:
        other = b.build(OTHER)  # the base layer is intact, so other snapshots still work
        attempts: list[Callable[[], object]] = [lambda: b.build(TEMPLATE), lambda: b.create(snap)]
        attempts.append(lambda: b.fork(snap, 2))
        with b.create(other) as sandbox:
            attempts.append(lambda: sandbox.restore(snap))
            for attempt in attempts:
                with pytest.raises(SnapshotCorruptError) as caught:
                    attempt()
                assert caught.value.layer_id == snap.layers[-1] and caught.value.path == "/workspace/a"
                assert snap.layers[-1] in str(caught.value) and "/workspace/a" in str(caught.value)
                assert "Delete the layer" in str(caught.value)
            assert sandbox.start_digest == other.digest
            assert sandbox.exec("cat o").stdout == "other\n"
        assert b.verify(snap) is False


def _truncate(layer: Path) -> None:
    os.truncate(layer / "workspace" / "src" / "main.py", 0)


def _add(layer: Path) -> None:
    (layer / "workspace" / "src" / "extra").write_text("x")


def _add_first(layer: Path) -> None:
    (layer / "workspace" / "src" / "0first").write_text("x")


def _remove(layer: Path) -> None:
    (layer / "workspace" / "src" / "main.py").unlink()


def _chmod(layer: Path) -> None:
    os.chmod(layer / "workspace" / "src" / "main.py", 0o777)


def _retarget(layer: Path) -> None:
    link = layer / "workspace" / "link"
    link.unlink()
    link.symlink_to("/etc/passwd")


@pytest.mark.parametrize(
    ("damage", "path", "what"),
    [
        (_truncate, "/workspace/src/main.py", "content changed"),
        (_add, "/workspace/src/extra", "added"),
        (_add_first, "/workspace/src/0first", "added"),
        (_remove, "/workspace/src/main.py", "missing"),
        (_chmod, "/workspace/src/main.py", "mode changed"),
        (_retarget, "/workspace/link", "target"),
    ],
)
def test_each_kind_of_damage_names_the_first_differing_path(
    tmp_path: Path, damage: Callable[[Path], None], path: str, what: str
) -> None:
    store = _layer_store(tmp_path)
    staged_layer = _stage(store, _workspace)
    damage(store.path(staged_layer))
    with pytest.raises(SnapshotCorruptError, match=what) as caught:
        _reopen(store).verify(staged_layer)
    assert caught.value.path == path and caught.value.layer_id == staged_layer


def test_metadata_only_changes_pass_and_refresh_the_manifest(tmp_path: Path) -> None:
    store = _layer_store(tmp_path)
    layer_id = _stage(store, _workspace)
    digest = store.verify(layer_id)
    target = store.path(layer_id) / "workspace" / "a"
    os.utime(target, (1, 1))  # a touch changes the stat key, not the content
    manifest_path = store.manifests / f"{layer_id}.json"
    before = manifest_path.read_bytes()
    assert _reopen(store).verify(layer_id) == digest
    assert manifest_path.read_bytes() != before  # the re-read entry's new key was recorded
    assert _reopen(store).verify(layer_id) == digest


def test_a_lost_or_edited_manifest_is_rebuilt_from_content_never_trusted(tmp_path: Path) -> None:
    store = _layer_store(tmp_path)
    layer_id = _stage(store, _workspace)
    digest = store.verify(layer_id)
    manifest_path = store.manifests / f"{layer_id}.json"
    data = json.loads(manifest_path.read_bytes())
    data["entries"][-1][5] = "0" * 64  # a forged content hash: the manifest no longer hashes to its id
    manifest_path.unlink()
    manifest_path.write_text(json.dumps(data))
    assert _reopen(store).verify(layer_id) == digest  # rehashed from content, which is intact
    manifest_path.unlink()
    (store.path(layer_id) / "workspace" / "a").write_text("changed")
    with pytest.raises(SnapshotCorruptError, match="does not hold the content its name says"):
        _reopen(store).verify(layer_id)


def test_an_edited_record_digest_is_refused_so_start_digest_is_what_was_verified(
    built: tuple[Path, Snapshot],
) -> None:
    root, snap = built
    record = root / "snapshots" / f"{snap.id}.json"
    data = json.loads(record.read_text())
    data["digest"] = "0" * 64
    record.write_text(json.dumps(data))
    forged = Snapshot.from_dict({k: v for k, v in data.items() if k != "format"})
    with LocalBackend(store_dir=root, **OPTIONS) as b:
        with pytest.raises(SnapshotCorruptError, match="chain to another digest"):
            b.create(forged)
        with pytest.raises(SnapshotCorruptError, match="chain to another digest"):
            b.build(TEMPLATE)
        with b.create(snap) as sandbox:  # the true digest still proves
            assert sandbox.start_digest == snap.digest == b.store.verified_digest(snap)


def test_later_uses_in_a_process_cost_nothing(shared: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = shared.build(TEMPLATE)
    with shared.create(snap):
        pass

    def no_walk(*args: object, **kwargs: object) -> None:
        raise AssertionError("a checked layer was walked again")

    monkeypatch.setattr(manifest, "check", no_walk)
    monkeypatch.setattr(manifest, "scan", no_walk)
    with shared.create(snap) as sandbox:
        sandbox.restore(snap)
    assert shared.build(TEMPLATE) == snap


# -- 3. sparse files -----------------------------------------------------------------


def test_sparse_files_stay_sparse_and_digest_without_reading_holes(shared: LocalBackend) -> None:
    snap = shared.build(TEMPLATE)
    with shared.create(snap) as sandbox:
        sandbox.exec("truncate -s 3G big && printf x | dd of=big bs=1 seek=2147483648 conv=notrunc 2>/dev/null")
        sandbox.exec("truncate -s 1T huge && printf y >> huge")
        started = time.monotonic()
        sparse = sandbox.snapshot()
        elapsed = time.monotonic() - started
    layer = shared.store.layers.path(sparse.layers[-1]) / "workspace"
    for name, size in (("big", 3 << 30), ("huge", (1 << 40) + 1)):
        st = os.stat(layer / name)
        assert st.st_size == size and st.st_blocks * 512 < 1 << 20
    assert elapsed < 30, f"a snapshot of sparse files took {elapsed:.1f}s: holes were read"
    with shared.create(sparse) as sandbox:
        out = sandbox.exec("dd if=big bs=1 skip=2147483648 count=1 2>/dev/null; tail -c 1 huge; stat -c %s huge")
        assert out.stdout == f"xy{(1 << 40) + 1}\n"


def test_holes_and_written_zeros_digest_alike(tmp_path: Path) -> None:
    def sparse(d: Path) -> None:
        with open(d / "f", "wb") as fh:
            fh.truncate(8 << 20)
            fh.seek(5 << 20)
            fh.write(b"data")

    def dense(d: Path) -> None:
        (d / "f").write_bytes(bytes(5 << 20) + b"data" + bytes((3 << 20) - 4))

    store = _layer_store(tmp_path)
    assert _stage(store, sparse) == _stage(store, dense)
    assert _stage(store, sparse) != _stage(store, lambda d: (d / "f").write_bytes(bytes(8 << 20)))


def test_older_records_are_treated_as_absent_and_rebuilt(built: tuple[Path, Snapshot]) -> None:
    root, snap = built
    for record in [*(root / "snapshots").glob("*.json"), *(root / "bases").glob("*.json")]:
        data = json.loads(record.read_text())
        if record.parent.name == "snapshots":
            del data["format"]  # as format 1 wrote them
        else:
            data["format"] = digest.FORMAT - 1
        record.unlink()
        record.write_text(json.dumps(data))
    with LocalBackend(store_dir=root, **OPTIONS) as b:
        assert b.snapshots() == [] and b.store.find(snap.id) is None
        again = b.build(TEMPLATE)
        assert again.digest == snap.digest and b.verify(again)
        assert json.loads((root / "snapshots" / f"{again.id}.json").read_text())["format"] == digest.FORMAT


# -- 4. size limit ---------------------------------------------------------------------


def test_a_snapshot_over_the_limit_fails_cleanly(tmp_path: Path, store_dir: Path, snap: Snapshot) -> None:
    root = new_store(tmp_path / "store", store_dir)
    with LocalBackend(store_dir=root, max_snapshot_mb=1, **OPTIONS) as b:
        start = b.build(TEMPLATE)
        before = {d: sorted(os.listdir(root / d)) for d in ("layers", "manifests", "snapshots")}
        with b.create(start) as sandbox:
            sandbox.exec("truncate -s 100G sparse")  # holes do not count
            assert sandbox.snapshot().digest != start.digest
            sandbox.exec("head -c 2M /dev/urandom > big")
            with pytest.raises(SnapshotTooLargeError, match="max_snapshot_mb=1"):
                sandbox.snapshot()
            assert sandbox.exec("echo alive").stdout == "alive\n"  # thawed again
    assert len(os.listdir(root / "snapshots")) == len(before["snapshots"]) + 1  # only the sparse one
    assert staging_entries(root) == []


# -- 5. deep trees -------------------------------------------------------------------

DEEP = f"""
import os
for _ in range({DEPTH}):
    os.mkdir("dd"); os.chdir("dd")
open("bottom", "w").write("deep")
"""
READ_DEEP = f"""
import os
for _ in range({DEPTH}):
    os.chdir("dd")
print(open("bottom").read())
"""


def test_a_tree_2000_levels_deep_snapshots_digests_restores_and_verifies(shared: LocalBackend) -> None:
    snap = shared.build(TEMPLATE)
    with shared.create(snap) as sandbox:
        assert sandbox.exec("python3 -", stdin=DEEP).ok
        deep = sandbox.snapshot()
        sandbox.restore(deep)
        assert sandbox.exec("python3 -", stdin=READ_DEEP).stdout == "deep\n"
    assert shared.verify(deep)
    with shared.create(deep) as sandbox:
        assert sandbox.exec("python3 -", stdin=READ_DEEP).stdout == "deep\n"


def test_walks_go_past_path_max_recursion_and_fd_limits(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        _make_deep(src, DEPTH)
        treecopy.copy_tree(src, dst)
        assert manifest.scan(src, id_offset=0).digest == manifest.scan(dst, id_offset=0).digest
        layers.shift_owners(dst, 7)
        assert manifest.scan(dst, id_offset=7).digest == manifest.scan(src, id_offset=0).digest
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        layers.remove_tree(dst)  # pytest's recursive cleanup could not remove these trees
        layers.remove_tree(src)
    assert not dst.exists() and not src.exists()


def test_walks_never_follow_symlinks(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("host file")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "escape").symlink_to(outside)
    (tree / "file-link").symlink_to(outside / "secret")
    copy = tmp_path / "copy"
    copy.mkdir()
    treecopy.copy_tree(tree, copy)
    assert (copy / "escape").is_symlink() and os.readlink(copy / "escape") == str(outside)
    layers.remove_tree(tree)
    assert (outside / "secret").read_text() == "host file"


# -- 6. hard links ---------------------------------------------------------------------


def test_hard_links_are_kept_and_digested_as_groups(shared: LocalBackend, tmp_path: Path) -> None:
    snap = shared.build(TEMPLATE)
    with shared.create(snap) as sandbox:
        sandbox.exec("echo x > one && ln one two && mkdir d && ln one d/three")
        linked = sandbox.snapshot()
    layer = shared.store.layers.path(linked.layers[-1]) / "workspace"
    assert len({os.stat(layer / p).st_ino for p in ("one", "two", "d/three")}) == 1
    with shared.create(linked) as sandbox:
        # (A write would break the link: overlayfs without index=on copies up one path only.)
        assert sandbox.exec("stat -c '%h %i' one two d/three | uniq").stdout.split()[0] == "3"
        assert len(set(sandbox.exec("stat -c %i one two d/three").stdout.split())) == 1

    def links(d: Path) -> None:
        (d / "a").write_text("same")
        os.link(d / "a", d / "b")

    def copies(d: Path) -> None:
        (d / "a").write_text("same")
        (d / "b").write_text("same")

    store = _layer_store(tmp_path)
    assert _stage(store, links) == _stage(store, links)  # other inode numbers, same digest
    assert _stage(store, links) != _stage(store, copies)
    shifted = tmp_path / "shifted"
    shifted.mkdir()
    links(shifted)
    layers.shift_owners(shifted, 100000)  # one inode, two paths: shifted once
    assert os.stat(shifted / "a").st_uid == os.stat(shifted / "b").st_uid == 100000


# -- 7. interrupted snapshots ----------------------------------------------------------


def test_an_interrupted_snapshot_leaves_nothing(shared: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = shared.build(TEMPLATE)
    root = shared.store.root

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    with shared.create(snap) as sandbox:
        sandbox.exec("mkdir -p deep/er && for i in 1 2 3; do echo $i > deep/er/f$i; done")
        records = sorted(os.listdir(root / "snapshots"))
        monkeypatch.setattr(treecopy, "_copy_data", interrupted)
        with pytest.raises(KeyboardInterrupt):
            sandbox.snapshot()
        monkeypatch.undo()
        assert staging_entries(root) == [] and sorted(os.listdir(root / "snapshots")) == records
        assert sandbox.exec("cat deep/er/f3").stdout == "3\n"  # thawed, and the snapshot can be retried
        assert sandbox.snapshot().digest != snap.digest


KILLED = """
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from pool.backends.local.store.layers import LayerStore
store = LayerStore(Path({layers!r}), manifests=Path({manifests!r}), id_offset=0)
with store.staging("test") as staged:
    (staged / "half-written").write_bytes(b"x" * 4096)
    print("staged", flush=True)
    time.sleep(600)
"""


def test_staging_of_killed_processes_is_reaped_and_live_ones_kept(built: tuple[Path, Snapshot]) -> None:
    root, _ = built
    script = KILLED.format(root=str(ROOT), layers=str(root / "layers"), manifests=str(root / "manifests"))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "staged"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(staging_entries(root)) == 1
    legacy_old, legacy_new = root / "layers" / ".tmp-old", root / "layers" / ".tmp-new"
    legacy_old.mkdir()
    legacy_new.mkdir()
    os.utime(legacy_old, (0, 0))
    with contextlib.ExitStack() as mine:
        live = mine.enter_context(LayerStore(root / "layers", manifests=root / "manifests", id_offset=0).staging("x"))
        with LocalBackend(store_dir=root, **OPTIONS):
            assert sorted(staging_entries(root)) == sorted([live, legacy_new])
    layers.remove_tree(legacy_new)
    assert staging_entries(root) == []


def test_a_full_store_is_a_clear_error_and_keeps_nothing(tmp_path: Path, store_dir: Path, snap: Snapshot) -> None:
    root = tmp_path / "small"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(root)], check=True)
    try:
        new_store(root, store_dir)
        with LocalBackend(store_dir=root, **OPTIONS) as b:
            start = b.build(TEMPLATE)
            records = sorted(os.listdir(root / "snapshots"))
            with b.create(start) as sandbox:
                sandbox.exec("head -c 24M /dev/urandom > big")
                with pytest.raises(StoreFullError, match="ran out of space"):
                    sandbox.snapshot()
                assert staging_entries(root) == [] and sorted(os.listdir(root / "snapshots")) == records
                sandbox.exec("rm big && echo small > s")
                assert b.verify(sandbox.snapshot())  # the store still works
    finally:
        subprocess.run(["umount", "-l", str(root)], check=True)


# -- helpers -------------------------------------------------------------------------


def _layer_store(tmp_path: Path) -> LayerStore:
    return LayerStore(tmp_path / "layers", manifests=tmp_path / "manifests", id_offset=0)


def _reopen(store: LayerStore) -> LayerStore:
    """The same store as a new process sees it (nothing checked yet)."""
    return LayerStore(store.root, manifests=store.manifests, id_offset=store.id_offset)


def _stage(store: LayerStore, fill: Callable[[Path], object]) -> str:
    with store.staging("test") as staged:
        fill(staged)
        layer_id, _ = store.commit(staged)
    return layer_id


def _workspace(d: Path) -> None:
    (d / "workspace" / "src").mkdir(parents=True)
    (d / "workspace" / "a").write_text("hi\n")
    (d / "workspace" / "src" / "main.py").write_text("print(1)\n")
    (d / "workspace" / "link").symlink_to("a")


def _make_deep(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("dd", dir_fd=fd)
        child = os.open("dd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    leaf = os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(leaf, b"deep")
    os.close(leaf)
    os.close(fd)
