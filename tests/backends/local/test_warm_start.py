"""The warm-up of an instance set up ahead of time: it looks up the first command's shell, loader and
libraries in the new overlay (sandboxd/instance/warm.c), and never writes, runs or waits on anything."""

from __future__ import annotations

import os
import shutil
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import LocalBackend, LocalSandbox, Template
from tests.backends.local.test_rootfs_base import _libraries, _minimal_rootfs
from tests.support.needs import skip_missing

# An ELF header that claims 64 bits and 60 program headers far away, then noise.
BROKEN_ELF = (
    b"\x7fELF\x02\x01\x01" + bytes(9) + bytes(16) + (1 << 40).to_bytes(8, "little") + bytes(12) + b"\x38\x00\x3c\x00"
)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    with LocalBackend(store_dir=tmp_path_factory.mktemp("warm-start")) as made:
        yield made


def _fresh(sandbox: LocalSandbox) -> None:
    changes = sandbox.changes()
    assert (changes.added, changes.changed, changes.removed) == ((), (), ()), changes


def test_a_fresh_instance_holds_no_trace_of_the_warm_up(backend: LocalBackend) -> None:
    snapshot = backend.build(Template(name="warm-clean", setup=["true"]))
    sandbox = backend.create(snapshot)
    _fresh(sandbox)
    sandbox.exec("echo x > /tmp/x")
    sandbox.restore()  # to the spare, warmed while the sandbox ran
    _fresh(sandbox)
    assert sandbox.exec("true").ok
    sandbox.close()


def _rootfs(tree: Path) -> Path:
    """A small root filesystem of host binaries (see test_rootfs_base), with mkfifo and ln."""
    _minimal_rootfs(tree)
    for tool in ("mkfifo", "ln"):
        binary = shutil.which(tool)
        if binary is None:
            skip_missing(f"{tool} is not installed")
        real = os.path.realpath(binary)
        for path in [real, *_libraries(real)]:
            target = tree / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    tarball = tree.with_suffix(".tar")
    with tarfile.open(tarball, "w") as tar:
        tar.add(tree, arcname=".")
    return tarball


@pytest.mark.parametrize("kind", ["fifo", "broken elf", "device"])
def test_a_shell_that_is_no_program_does_not_hold_up_a_start(backend: LocalBackend, tmp_path: Path, kind: str) -> None:
    """Checkpoints whose /bin/sh is a FIFO, a broken ELF file or a device still start, restore and fork at once."""
    if shutil.which("ldd") is None:
        skip_missing("ldd is not installed")
    template = Template(name="warm-rootfs", base=str(_rootfs(tmp_path / "tree")), workdir="/")
    sandbox = backend.create(backend.build(template))
    shell = os.path.realpath(shutil.which("sh") or "/bin/sh")  # /bin/sh links to it (see _minimal_rootfs)
    make = {"fifo": f"rm {shell} && mkfifo {shell}", "device": f"rm {shell} && ln -s /dev/tty {shell}"}
    assert sandbox.exec(make.get(kind, f"rm {shell}")).ok
    if kind == "broken elf":
        sandbox.write_file(shell, BROKEN_ELF + bytes(4096), mode=0o755)
    checkpoint = sandbox.snapshot()
    started = time.monotonic()
    for _ in range(3):
        sandbox.restore(checkpoint)
        assert sandbox.is_alive
    for child in backend.fork(checkpoint, 2):
        assert child.is_alive
        child.close()
    sandbox.close()
    assert time.monotonic() - started < 30, f"starts with /bin/sh as a {kind} were held up"
