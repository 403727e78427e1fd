"""A root filesystem tarball (e.g. from `docker export`) works as a base, with no Docker engine."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from pool import ConfigError, LocalBackend, Template
from tests.support.needs import skip_missing

TOOLS = ("sh", "cat", "ls", "echo", "mkdir", "id", "rm")


def _minimal_rootfs(dest: Path) -> None:
    """Copy a few host binaries and the libraries they load into a fresh tree."""
    for tool in TOOLS:
        binary = shutil.which(tool)
        if binary is None:
            skip_missing(f"{tool} is not installed")
        real = os.path.realpath(binary)
        for path in [real, *_libraries(real)]:
            target = dest / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        (dest / "bin").mkdir(exist_ok=True)
        link = dest / "bin" / tool
        if not link.exists():
            link.symlink_to(real)
    (dest / "etc").mkdir(exist_ok=True)
    (dest / "etc" / "os-release").write_text("ID=snapgym-test\n")


def _libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            libs.append(os.path.realpath(path))
            if os.path.realpath(path) != path:
                libs.append(path)
    return libs


def test_tarball_base_builds_and_runs(tmp_path: Path, backend: LocalBackend) -> None:
    if shutil.which("ldd") is None:
        skip_missing("ldd is not installed")
    tree = tmp_path / "tree"
    _minimal_rootfs(tree)
    tarball = tmp_path / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        tar.add(tree, arcname=".")
    template = Template(name="from-tarball", base=str(tarball), setup=["echo built > /data"], workdir="/")
    snap = backend.build(template)
    assert backend.build(template).id == snap.id  # cached by the tarball's content
    with backend.create(snap) as sandbox:
        r = sandbox.exec("cat /data /etc/os-release; id -u; ls /usr/bin/python3 2>&1")
        assert r.stdout.startswith("built\nID=snapgym-test\n0\n")
        assert "No such file" in r.stdout  # not the host userland
        sandbox.exec("rm /data")
        sandbox.restore()
        assert sandbox.read_file("/data") == b"built\n"


def test_missing_base_is_a_clear_error(backend: LocalBackend) -> None:
    with pytest.raises(ConfigError, match="neither 'host' nor an existing root filesystem"):
        backend.build(Template(name="bad-base", base="/no/such/rootfs.tar"))
