"""What the tests share about backends: the limits every test backend runs with, the workspace
template, and one parameter per backend this machine can run (the backend matrix)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from pool import Template, available_backends

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


def backend_params() -> list[Any]:
    """One parameter per backend; one this machine cannot run is skipped with the reason.

    CI starts a Docker engine, so there the Docker backend runs and a broken engine fails
    its tests instead of skipping them (``SNAPGYM_REQUIRE_BACKENDS=local,docker``).
    """
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
