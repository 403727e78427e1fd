"""The Daytona backend against the real Daytona service: run only when asked (``SNAPGYM_LIVE=1``) and a key
is present (``DAYTONA_API_KEY``), since it creates billed sandboxes. The same paths as the stand-in tests:
the conformance suite, a build found by name, and a reference solution scored through strict
verification; afterwards nothing of the test is left running."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import envs
from pool import Template
from pool.testing import check_backend

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        os.environ.get("SNAPGYM_LIVE") != "1" or not os.environ.get("DAYTONA_API_KEY"),
        reason="live Daytona tests need SNAPGYM_LIVE=1 and DAYTONA_API_KEY (they create billed sandboxes)",
    ),
]


@pytest.fixture(scope="module")
def live_backend() -> Iterator[object]:
    from pool.backends.daytona import DaytonaBackend

    with DaytonaBackend(sandbox_timeout_s=600) as backend:
        yield backend


def test_the_conformance_suite_passes_on_daytona(live_backend: object) -> None:
    check_backend(live_backend)  # type: ignore[arg-type]


def test_a_builtin_task_scores_oracle_one_and_noop_zero_on_daytona(live_backend: object) -> None:
    check = envs.check_task(live_backend, envs.load_task("csv-sales-summary"))  # type: ignore[arg-type]
    assert (check.oracle.reward, check.noop.reward) == (1.0, 0.0), check.oracle


def test_a_second_build_is_found_by_name(live_backend: object) -> None:
    template = Template(name="snapgym-live", setup=["mkdir -p /w && echo ready > /w/state"], workdir="/w")
    first = live_backend.build(template)  # type: ignore[attr-defined]
    assert live_backend.build(template).layers == first.layers  # type: ignore[attr-defined]
