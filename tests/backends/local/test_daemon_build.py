"""The sandbox daemon's build: static where the C library has an archive, else dynamic with a warning."""

from __future__ import annotations

import logging
import shutil
import struct
from pathlib import Path

import pytest

from pool import Snapshot
from pool.backends.local.backend import LocalBackend
from pool.backends.local.daemon import build
from pool.errors import CompilerMissingError

PT_INTERP = 3


def dynamic_loader(binary: Path) -> bool:
    """Whether the ELF file asks for a program interpreter (ld.so), i.e. is dynamically linked."""
    data = binary.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2, f"{binary} is not a 64-bit ELF file"
    (e_phoff,) = struct.unpack_from("<Q", data, 0x20)
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 0x36)
    types = [struct.unpack_from("<I", data, e_phoff + i * e_phentsize)[0] for i in range(e_phnum)]
    return PT_INTERP in types


def test_the_daemon_in_use_is_linked_statically(backend: LocalBackend, snap: Snapshot, store_dir: Path) -> None:
    with backend.create(snap) as sandbox:
        assert sandbox.exec("true").exit_code == 0
    binary = build.daemon_binary(store_dir)  # the one the backend started: built already, same hash
    assert binary.exists()
    assert not dynamic_loader(binary), "CI installs libc6-dev, whose libc.a links the daemon statically"


def test_no_static_c_library_falls_back_to_a_dynamic_daemon_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gcc = shutil.which("gcc")
    assert gcc is not None
    # A compiler as on a machine without glibc-static: linking with -static fails, the rest works.
    wrapper = tmp_path / "cc-without-libc-a"
    wrapper.write_text(
        "#!/bin/sh\n"
        'for arg; do [ "$arg" = -static ] && { echo "ld: cannot find -lc" >&2; exit 1; }; done\n'
        f'exec {gcc} "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    with caplog.at_level(logging.WARNING, logger=build.__name__):
        binary = build.daemon_binary(tmp_path / "cache")
    assert binary.exists() and dynamic_loader(binary)
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "linked dynamically" in warning and "glibc-static" in warning and str(binary) in warning
    # Cached: no second build, no second warning.
    caplog.clear()
    assert build.daemon_binary(tmp_path / "cache") == binary
    assert not caplog.records


def test_a_compiler_that_fails_both_ways_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "cc-broken"
    broken.write_text('#!/bin/sh\necho "fatal error: sys/types.h: No such file or directory" >&2\nexit 1\n')
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with pytest.raises(CompilerMissingError, match="libc6-dev") as caught:
        build.daemon_binary(tmp_path / "cache")
    assert "sys/types.h" in str(caught.value)
    assert not list((tmp_path / "cache" / "bin").glob("snapgym-sandboxd-*"))
