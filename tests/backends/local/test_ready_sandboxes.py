"""The local backend's ready sandbox per snapshot (pool.backends.local.ready): what create()
hands over is a fresh start of the snapshot with the caller's labels, and nothing is left
behind at close."""

from __future__ import annotations

from pathlib import Path

from pool import LocalBackend, Template
from pool.backends.local import cgroups
from tests.backends.local.test_cleanup import _processes_matching


def _ready(backend: LocalBackend) -> int:
    return len(backend._ready._waiting)


def test_a_snapshot_gets_a_ready_sandbox_from_its_second_create_on(tmp_path: Path) -> None:
    backend = LocalBackend(store_dir=tmp_path / "store", runtime_dir=tmp_path / "run")
    try:
        snap = backend.build(Template(name="ready", setup=["echo base > /base"]))
        first = backend.create(snap)
        assert _ready(backend) == 0  # one create: nobody pays for an idle sandbox
        second = backend.create(snap, labels={"job": "b"})
        assert _ready(backend) == 1
        second.exec("echo dirty > /base; touch /mine; sleep 4711 >/dev/null 2>&1 &")
        third = backend.create(snap, labels={"job": "c"})
        assert _ready(backend) == 1  # taken, and the next one started
        assert third.labels["job"] == "c" and "snapgym.owner" in third.labels
        assert third.start_digest == snap.digest
        state = third.exec("cat /base; ls /mine 2>&1; pgrep -x sleep || echo none")
        assert state.stdout.splitlines()[0] == "base" and "No such file" in state.stdout
        assert state.stdout.splitlines()[-1] == "none"
        third.exec("touch /after")
        third.restore()  # a ready sandbox starts without its spare: the first restore builds one
        third.restore()
        assert third.exec("ls /after 2>&1; cat /base").stdout.endswith("No such file or directory\nbase\n")
        for box in (first, second, third):
            box.close()
    finally:
        tag = backend.tag
        backend.close()
    assert _processes_matching("sleep 4711") == []
    assert list((tmp_path / "run").iterdir()) == []
    assert [g for g in cgroups.stale_groups(lambda name: False) if g.name.startswith(f"{tag}-")] == []


def test_ready_sandboxes_can_be_turned_off(tmp_path: Path) -> None:
    backend = LocalBackend(store_dir=tmp_path / "store", runtime_dir=tmp_path / "run", ready_sandboxes=False)
    try:
        snap = backend.build(Template(name="not-ready", setup=["true"]))
        boxes = [backend.create(snap) for _ in range(3)]
        assert _ready(backend) == 0
        for box in boxes:
            box.close()
    finally:
        backend.close()
