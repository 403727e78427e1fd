"""An agent on the Docker backend cannot fill the host: its disk, its files and its PID 1's log.

The attacks a reward-seeking (or careless) policy plays against a shared machine: write until the
disk is full, create files until the inodes run out, and write into the container's own standard
output (``/proc/1/fd/1``), which the engine's default log driver keeps on the host's disk. Each
must end inside the sandbox (``ENOSPC``, an error) with the host's free space where it was.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from pool import Snapshot, Template
from pool.backends.docker import DockerBackend
from pool.capabilities import Enforcement
from pool.verification import VerificationPlan, VerifyMode
from tests.support.backends import backend_missing
from tests.support.fixtures.docker_fixtures import PREFIX, backend, remove_prefix

pytestmark = [pytest.mark.docker, backend_missing("docker")]

DISK_MB = 48
MIB = 1 << 20


@pytest.fixture(scope="module")
def limited() -> Iterator[DockerBackend]:
    try:
        with backend(disk_limit_mb=DISK_MB, memory_limit_mb=512) as made:
            yield made
    finally:
        remove_prefix(PREFIX)


@pytest.fixture(scope="module")
def snap(limited: DockerBackend) -> Snapshot:
    return limited.build(Template(name="docker-disk-tests", workdir="/workspace"))


def _host_free_bytes() -> int:
    client = docker.from_env()
    try:
        return shutil.disk_usage(client.info()["DockerRootDir"]).free
    finally:
        client.close()


def test_the_disk_limit_is_enforced_and_said(limited: DockerBackend) -> None:
    assert limited.capabilities.limits["disk"] in (Enforcement.QUOTA, Enforcement.TMPFS)


FILL = "head -c 400000000 /dev/zero > /workspace/fill"
MANY_FILES = (
    "mkdir -p /workspace/many && cd /workspace/many && i=0; "
    "while [ $i -lt 100000 ] && true > f$i 2>/dev/null; do i=$((i+1)); done; echo $i"
)
INTO_PID1 = "head -c 100000000 /dev/zero > /proc/1/fd/1; echo $?"


def test_filling_the_disk_is_enospc_inside_and_nothing_outside(limited: DockerBackend, snap: Snapshot) -> None:
    with limited.create(snap) as sandbox:
        filled = sandbox.exec(FILL, timeout_s=120)
        assert filled.exit_code != 0 and "No space left on device" in filled.stderr, filled
        size = int(sandbox.exec("stat -c %s /workspace/fill").stdout)
        assert size <= DISK_MB * MIB
        listed = sandbox.exec("df -m / | tail -1").stdout.split()
        assert int(listed[1]) <= DISK_MB, listed  # df inside shows the limit
        sandbox.restore()  # a fresh start has its whole disk again
        again = sandbox.exec("head -c 8000000 /dev/zero > /workspace/small && echo ok")
        assert again.stdout == "ok\n", again


def test_running_out_of_files_stays_inside(limited: DockerBackend, snap: Snapshot) -> None:
    with limited.create(snap) as sandbox:
        made = sandbox.exec(MANY_FILES, timeout_s=300)
        assert made.stdout.strip().isdigit() and int(made.stdout) < 100000, made  # the inode limit ended it


def test_writing_into_pid1s_output_fills_no_log_on_the_host(limited: DockerBackend, snap: Snapshot) -> None:
    with limited.create(snap) as sandbox:
        written = sandbox.exec(INTO_PID1, timeout_s=120)
        container = docker.from_env().api.inspect_container(sandbox.container_id)
        assert container["HostConfig"]["LogConfig"]["Type"] == "none", written
        log = container.get("LogPath") or ""
        assert not log or not os.path.exists(log) or os.path.getsize(log) < MIB


@pytest.mark.slow  # the slow set runs alone: nothing else writes to the host's disk meanwhile
@pytest.mark.parametrize("attack", [FILL, MANY_FILES, INTO_PID1], ids=["fill", "inodes", "pid1-output"])
def test_the_hosts_free_space_is_unchanged_by_a_disk_attack(
    limited: DockerBackend, snap: Snapshot, attack: str
) -> None:
    before = _host_free_bytes()
    with limited.create(snap) as sandbox:
        sandbox.exec(attack, timeout_s=300)
        assert abs(_host_free_bytes() - before) < 16 * MIB  # what was written is the sandbox's, not the host's


def test_the_layer_tmpfs_goes_with_its_container(limited: DockerBackend, snap: Snapshot) -> None:
    if limited.capabilities.limits["disk"] is not Enforcement.TMPFS:
        pytest.skip("the engine enforces the disk itself (storage_opt): no tmpfs to unmount")
    with limited.create(snap) as sandbox:
        layer = os.path.dirname(
            docker.from_env().api.inspect_container(sandbox.container_id)["GraphDriver"]["Data"]["UpperDir"]
        )
        assert layer in _mount_points()
    limited.link.containers.drain()  # removal runs on a background thread
    assert layer not in _mount_points()


def _mount_points() -> set[str]:
    with open("/proc/self/mounts") as mounts:
        return {line.split()[1] for line in mounts}


def test_an_agent_that_used_every_inode_is_still_verified(
    limited: DockerBackend, snap: Snapshot, tmp_path: Path
) -> None:
    """Strict verification reads the killed agent's outputs; the engine must mount its layer again
    for that, which needs an inode the agent may have taken: the score stands, not an infra error."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test.sh").write_text("cat /workspace/answer > /logs/verifier/reward.txt\n")
    with limited.create(snap) as sandbox:
        sandbox.exec("echo 1 > /workspace/answer; cd /tmp && i=0; while true > f$i 2>/dev/null; do i=$((i+1)); done")
        assert sandbox.exec("df -i / | tail -1").stdout.split()[3] == "0"  # no inode left
        report = sandbox.begin_verification(
            VerificationPlan(mode=VerifyMode.STRICT, outputs=("/workspace",), tests_dir=tests, known_good=snap)
        )
        assert report.missing_outputs == ()
        assert sandbox.exec("cat /workspace/answer").stdout == "1\n"  # in the verifier's container
