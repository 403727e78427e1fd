"""The sandbox daemon's copy of the host's mounts holds only what sandboxes reach (sandboxd/hostmounts.c).

Every instance is cloned with a copy of its keeper's mount namespace, which is a copy of the
daemon's: each host mount costs about 2 us per instance to copy and tear down again (issue 34,
docs/results/cost.md), and a host running containers holds hundreds. The daemon detaches, in its
private copy, every mount that is neither on the way to nor under the store, the host base's bind
sources, its stage directory, /proc, /sys or /dev. What must hold: the host's clutter is not in a
keeper's namespace (so no instance copies it), a mount the store lies under or inside is kept,
the host itself loses nothing, and sandboxes work as before.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import LocalBackend
from pool.backends.local.sandbox import LocalSandbox
from tests.support.backends import LIMITS, WORKSPACE_TEMPLATE
from tests.support.needs import skip_missing

CLUTTER = 40
"""Host mounts that no sandbox uses, as a container host has (docker's overlays, pods' volumes)."""


def _mount_points(pid: int | str) -> list[str]:
    """The mount points of a process's mount namespace, as it sees them (mountinfo's escapes kept)."""
    return [line.split()[4] for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()]


def _tmpfs(path: Path, size: str = "1m") -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder of host mounts made before the daemon starts: clutter, one the store lies under, one inside it."""
    if os.geteuid() != 0:
        skip_missing("needs root (mounts on the host; without it the daemon keeps every mount)")
    base = tmp_path_factory.mktemp("hostmounts")
    made: list[Path] = []
    try:
        for i in range(CLUTTER):
            made.append(base / "clutter" / f"pod {i}")  # a space: mountinfo escapes it
            _tmpfs(made[-1])
        made.append(base / "on-the-way")
        _tmpfs(made[-1], "256m")  # the store: the daemon's binary and the template's layers
        made.append(base / "on-the-way" / "store" / "inside")
        _tmpfs(made[-1])
        yield base
    finally:
        for path in reversed(made):
            subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture(scope="module")
def backend(host: Path) -> Iterator[LocalBackend]:
    with LocalBackend(store_dir=host / "on-the-way" / "store", **LIMITS) as made:
        yield made


@pytest.fixture(scope="module")
def sandbox(backend: LocalBackend) -> Iterator[LocalSandbox]:
    with backend.create(backend.build(WORKSPACE_TEMPLATE)) as made:
        assert isinstance(made, LocalSandbox)
        yield made


def _on_the_way_or_under(point: str, paths: list[str]) -> bool:
    return any(
        point == path or path.startswith(point.rstrip("/") + "/") or point.startswith(path + "/") for path in paths
    )


def test_a_keeper_holds_none_of_the_hosts_clutter(host: Path, backend: LocalBackend, sandbox: LocalSandbox) -> None:
    keeper = _mount_points(sandbox.keeper_pid)
    clutter = [point for point in keeper if "/clutter/" in point]
    assert clutter == [], f"the keeper (and so every instance) copies {len(clutter)} host mounts no sandbox uses"
    reached = [
        os.path.realpath(path)
        for path in (
            backend.store.root,
            backend.runtime.runtime_root,
            *(source for source, _ in backend.settings.host.binds),
        )
    ]
    reached += ["/proc", "/sys", "/dev"]
    assert [point for point in keeper if not _on_the_way_or_under(point, reached)] == []


def test_mounts_on_the_way_to_or_inside_the_store_are_kept(host: Path, sandbox: LocalSandbox) -> None:
    keeper = _mount_points(sandbox.keeper_pid)
    assert str(host / "on-the-way") in keeper
    assert str(host / "on-the-way" / "store" / "inside") in keeper
    for needed in ("/proc", "/sys", "/dev"):
        assert needed in keeper


def test_the_host_keeps_its_own_mounts(host: Path, sandbox: LocalSandbox) -> None:
    ours = _mount_points("self")
    assert sum("/clutter/pod\\040" in point for point in ours) == CLUTTER


def test_sandboxes_work_as_before(sandbox: LocalSandbox) -> None:
    assert sandbox.exec("cat /workspace/a && python3 -c 'print(6 * 7)'").stdout == "hi\n42\n"
    sandbox.restore()
    assert sandbox.exec("cat /workspace/a").stdout == "hi\n"
