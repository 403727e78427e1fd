"""A build has the room its task asks for, and a build that runs out of disk says so first.

Real Terminal-Bench 2 tasks ask for ``storage = "10G"`` and install large packages while they
build; with the backend's default disk, dpkg died of ENOSPC and the run reported only "setup step
1 exited 100", the cause buried in the output.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import BuildError, Resources, Template
from pool.backends.local import LocalBackend


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    with LocalBackend(store_dir=tmp_path_factory.mktemp("store"), disk_limit_mb=32, memory_limit_mb=512) as made:
        yield made


def test_a_build_gets_at_least_the_tasks_storage(small: LocalBackend, tmp_path: Path) -> None:
    template = Template(
        name="build-disk-room",
        setup=["head -c 48000000 /dev/zero > /opt/big"],  # over the backend's 32 MiB, within the task's 64
        resources=Resources(storage_mb=64),
    )
    snap = small.build(template)  # neither the build's disk nor the snapshot's size limit refuses it
    with small.create(snap) as sandbox:
        assert sandbox.exec("stat -c %s /opt/big").stdout == "48000000\n"


def test_a_build_that_fills_its_disk_says_so_in_its_first_line(small: LocalBackend) -> None:
    template = Template(name="build-disk-full", setup=["head -c 64000000 /dev/zero > /opt/big"])
    with pytest.raises(BuildError) as raised:
        small.build(template)
    first = str(raised.value).splitlines()[0]
    assert "out of disk" in first and "storage" in first, first
