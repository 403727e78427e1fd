"""Shared fixtures: one local backend per test session, over a temporary store, and
``any_backend``: every backend this machine can run, for the tests of the contract."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pool import Backend, LocalBackend, Snapshot, Template, available_backends, load_backend

LIMITS: dict[str, Any] = {"memory_limit_mb": 256, "pids_limit": 128}
"""The limits every test backend runs with."""
BACKEND_OPTIONS: dict[str, dict[str, Any]] = {"local": {"disk_limit_mb": 64}}
"""Test options per backend, on top of LIMITS."""

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
    with LocalBackend(store_dir=store_dir, **LIMITS, **BACKEND_OPTIONS["local"]) as b:
        yield b


@pytest.fixture(scope="session")
def snap(backend: LocalBackend) -> Snapshot:
    return backend.build(WORKSPACE_TEMPLATE)


def _backend_params() -> list[Any]:
    """One parameter per backend; one this machine cannot run is skipped with the reason.

    CI starts a Docker engine, so there the Docker backend runs and a broken engine fails
    its tests instead of skipping them (``SNAPGYM_REQUIRE_BACKENDS=local,docker``).
    """
    import os

    required = {name for name in os.environ.get("SNAPGYM_REQUIRE_BACKENDS", "").split(",") if name}
    params = []
    for name, reason in available_backends().items():
        marks = [pytest.mark.skip(reason=f"backend {name!r} cannot run here: {reason}")] if reason else []
        if reason and name in required:
            marks = []  # the fixture fails with the reason
        if name == "docker":
            marks.append(pytest.mark.docker)
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.fixture(scope="session", params=_backend_params())
def any_backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """Each backend this machine can run, with the test limits."""
    name = str(request.param)
    if name == "local":
        yield request.getfixturevalue("backend")
        return
    backend = load_backend(name, **LIMITS, **BACKEND_OPTIONS.get(name, {}))
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture(scope="session")
def any_snap(any_backend: Backend) -> Snapshot:
    """WORKSPACE_TEMPLATE built on ``any_backend``."""
    return any_backend.build(WORKSPACE_TEMPLATE)
