"""What the tests share about backends: the limits every test backend runs with, the workspace
template, and the backend matrix (:func:`backend_params`): every fixture that runs tests on several
backends takes its ``params`` from it, ``backend_params(only=("local", "docker"))`` for a subset,
and a single test that needs one backend asks :func:`need_backend` or :func:`backend_missing`."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import Any

import pytest

from pool import Template, available_backends
from tests.support.needs import needs, require_all, skip_missing

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


LIVE_ONLY = ("e2b", "daytona", "modal")
"""Backends the matrix runs only against the real provider, with its credentials: optional even under
``SNAPGYM_REQUIRE_ALL=1`` (their stand-ins are tested beside them, in tests/backends/cloud)."""


@functools.cache
def unavailable() -> dict[str, str | None]:
    """Every backend name -> None when it can run here, else why not (probed once per process)."""
    return available_backends()


def required_backends() -> set[str]:
    """The backends whose tests must run here: those ``SNAPGYM_REQUIRE_BACKENDS`` names, and under
    ``SNAPGYM_REQUIRE_ALL=1`` every backend but the live-only ones."""
    names = {name for name in os.environ.get("SNAPGYM_REQUIRE_BACKENDS", "").split(",") if name}
    if require_all():
        names |= {name for name in unavailable() if name not in LIVE_ONLY}
    return names


def backend_missing(name: str) -> pytest.MarkDecorator:
    """A :func:`~tests.support.needs.needs` mark: ``name`` cannot run here (skip, or fail where required)."""
    reason = unavailable()[name]
    return needs(reason, f"backend {name!r} cannot run here: {reason}", required=name in required_backends())


def need_backend(name: str) -> None:
    """Inside a test: skip it when backend ``name`` cannot run here (fail where the backend is required)."""
    reason = unavailable()[name]
    if reason is not None:
        skip_missing(f"backend {name!r} cannot run here: {reason}", required=name in required_backends())


def backend_params(only: Iterable[str] | None = None, *, standins: Iterable[str] = ()) -> list[Any]:
    """The backend matrix: one parameter per backend (id: its name), for ``params=`` of a fixture.

    Args:
        only: these backends, in this order (default: every backend ``pool`` knows).
        standins: cloud backends the fixture opens against their stand-in server, so they run
            everywhere and never skip.

    A backend this machine cannot run is skipped with the reason; it fails instead where it is
    required (:func:`required_backends`: CI starts a Docker engine, so a broken engine fails there).
    """
    names = list(unavailable()) if only is None else list(only)
    stand_ins = set(standins)
    params = []
    for name in names:
        marks = [] if name in stand_ins else [backend_missing(name)]
        if name == "docker":
            marks.append(pytest.mark.docker)
        params.append(pytest.param(name, marks=marks, id=name))
    return params
