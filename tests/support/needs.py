"""Skips that depend on this machine, in one place, and the CI switch that makes them failures.

A test that cannot run here because the machine lacks something (a tool, a Docker engine, root,
network namespaces, a browser, the npm registry) skips through :func:`skip_missing` or carries a
:func:`needs` mark; nothing else in the tests calls ``pytest.skip`` for such a reason. With
``SNAPGYM_REQUIRE_ALL=1`` (set in ``.ci/run``, whose machine installs everything the tests use)
each of these fails with its reason instead, so a tool CI forgot or an engine that stopped
answering is a red run, not a quiet skip.

Deliberately optional, even under the switch (these keep a plain ``pytest.skip``/``skipif``):

- live cloud tests (``tests/backends/cloud/test_cloud_live.py``, ``modal/test_modal_live.py``) and
  the cloud backends of the backend matrix: they need real credentials and create billed sandboxes;
- skips that follow from what a backend *is*, not from the machine: a verification mode a backend
  does not offer, a task a backend's base cannot run (``tests/attacks``, ``tests/egress``).

``SNAPGYM_REQUIRE_BACKENDS=local,docker`` (older, finer) makes only the named backends' skips
failures; :mod:`tests.support.backends` reads both.
"""

from __future__ import annotations

import importlib.util
import os
from typing import NoReturn

import pytest

REQUIRE_ALL = "SNAPGYM_REQUIRE_ALL"
"""The switch: ``1`` turns every environment-dependent skip into a failure."""
MARKER = "needs"
"""The mark :func:`needs` sets; ``tests/conftest.py`` acts on it before each test's fixtures."""


def require_all() -> bool:
    """Whether every environment-dependent skip must fail here (``SNAPGYM_REQUIRE_ALL=1``)."""
    return os.environ.get(REQUIRE_ALL, "") == "1"


def skip_missing(reason: str, *, required: bool | None = None, allow_module_level: bool = False) -> NoReturn:
    """Skip: this machine lacks what the test needs (``reason``); fail with the reason instead where it
    is required. ``required``: None follows the switch (``SNAPGYM_REQUIRE_ALL=1``); a bool decides
    (the backend matrix decides per backend: :func:`tests.support.backends.required_backends`)."""
    if required or (required is None and require_all()):
        pytest.fail(f"required here, but this machine cannot run it: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=allow_module_level)


def import_or_skip(module: str, reason: str) -> None:
    """``pytest.importorskip`` at a module's top for a dependency ``pip install -e '.[dev]'`` brings."""
    if importlib.util.find_spec(module) is None:
        skip_missing(reason, allow_module_level=True)


def needs(missing: object, reason: str, *, required: bool | None = None) -> pytest.MarkDecorator:
    """A mark for a test (or a module's ``pytestmark``) that needs something of this machine.

    ``missing`` true: the test goes to :func:`skip_missing` with ``reason`` before its fixtures are set
    up (``skipif``, but a failure under the switch). False: the mark does nothing.
    """
    return getattr(pytest.mark, MARKER)(reason if missing else None, required=required)


def check_needs(item: pytest.Item) -> None:
    """Skip or fail ``item`` for the first unmet :func:`needs` mark it carries (conftest's setup hook)."""
    for mark in item.iter_markers(MARKER):
        if mark.args and mark.args[0] is not None:
            skip_missing(str(mark.args[0]), required=mark.kwargs.get("required"))
