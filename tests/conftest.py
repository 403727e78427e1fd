"""Shared fixtures: one local backend per test session, over a temporary store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import LocalBackend, Snapshot, Template

WORKSPACE_TEMPLATE = Template(
    name="tests-workspace",
    setup=["echo hi > a", "mkdir -p src && echo 'print(1)' > src/main.py"],
    workdir="/workspace",
    healthcheck="test -f /workspace/a",
)


@pytest.fixture(scope="session")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="session")
def backend(store_dir: Path) -> Iterator[LocalBackend]:
    with LocalBackend(store_dir=store_dir, memory_limit_mb=256, pids_limit=128, disk_limit_mb=64) as b:
        yield b


@pytest.fixture(scope="session")
def snap(backend: LocalBackend) -> Snapshot:
    return backend.build(WORKSPACE_TEMPLATE)
