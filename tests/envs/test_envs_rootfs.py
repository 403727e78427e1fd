"""A task whose Dockerfile names an image mapped to a root filesystem tarball builds and runs, with no Docker."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

from envs import ShellEnv
from pool import LocalBackend
from tests.backends.local.test_rootfs_base import _minimal_rootfs
from tests.support.needs import skip_missing


def test_dockerfile_over_a_mapped_rootfs(
    tmp_path: Path, backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FROM tiny/image + bases={...: tarball}: COPY and RUN land, and the shell works without bash."""
    if shutil.which("ldd") is None or shutil.which("base64") is None or shutil.which("chmod") is None:
        skip_missing("ldd, base64 or chmod is not installed")
    tools = ("sh", "cat", "ls", "echo", "mkdir", "rm", "base64", "chmod")
    monkeypatch.setattr("tests.backends.local.test_rootfs_base.TOOLS", tools)
    tree = tmp_path / "tree"
    _minimal_rootfs(tree)
    tarball = tmp_path / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(tree, arcname=".")
    task = tmp_path / "tiny-task"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "environment" / "data.txt").write_text("payload\n")
    (task / "environment" / "Dockerfile").write_text(
        "FROM tiny/image:1.0\nWORKDIR /work\nCOPY data.txt ./\nRUN echo built > built.txt\nENV GREETING=hello\n"
    )
    (task / "instruction.md").write_text("Say hi.\n")
    (task / "task.toml").write_text('version = "1.0"\n')
    (task / "tests" / "test.sh").write_text("mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n")
    env = ShellEnv(task, backend=backend, bases={"tiny/image": str(tarball)})
    try:
        env.reset()
        obs, *_ = env.step("cat data.txt built.txt; echo $GREETING")
        assert obs["output"] == "payload\nbuilt\nhello\n[exit code 0]"
        _, reward, terminated, _, info = env.step("submit")
        assert (reward, terminated, info["scored"]) == (1.0, True, True)
    finally:
        env.close()
