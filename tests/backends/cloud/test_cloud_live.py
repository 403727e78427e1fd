"""The E2B and Daytona backends against the real services: each runs only when asked
(``SNAPGYM_LIVE=1``) and its key is present (``E2B_API_KEY``, ``DAYTONA_API_KEY``), since it creates
billed sandboxes. The same paths as the stand-in tests: the conformance suite, a build found by
name, a template from a public registry image, and a reference solution scored through strict
verification; afterwards nothing of the test is left running. (Modal's, with its GPU tasks:
tests/backends/cloud/modal/test_modal_live.py.)"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import envs
from pool import Template, load_backend
from pool.testing import check_backend

KEYS = {"e2b": "E2B_API_KEY", "daytona": "DAYTONA_API_KEY"}
"""Each provider and the variable its key is read from."""

pytestmark = pytest.mark.live


@pytest.fixture(scope="module", params=sorted(KEYS))
def live_backend(request: pytest.FixtureRequest) -> Iterator[object]:
    name, key = str(request.param), KEYS[str(request.param)]
    if os.environ.get("SNAPGYM_LIVE") != "1" or not os.environ.get(key):
        pytest.skip(f"live {name} tests need SNAPGYM_LIVE=1 and {key} (they create billed sandboxes)")
    with load_backend(name, sandbox_timeout_s=600) as backend:
        yield backend


def test_the_conformance_suite_passes(live_backend: object) -> None:
    check_backend(live_backend)  # type: ignore[arg-type]


def test_a_builtin_task_scores_oracle_one_and_noop_zero(live_backend: object) -> None:
    check = envs.check_task(live_backend, envs.load_task("csv-sales-summary"))  # type: ignore[arg-type]
    assert (check.oracle.reward, check.noop.reward) == (1.0, 0.0), check.oracle


def test_a_second_build_is_found_by_name(live_backend: object) -> None:
    template = Template(name="snapgym-live", setup=["mkdir -p /w && echo ready > /w/state"], workdir="/w")
    first = live_backend.build(template)  # type: ignore[attr-defined]
    assert live_backend.build(template).layers == first.layers  # type: ignore[attr-defined]


def test_a_template_from_a_public_registry_image(live_backend: object) -> None:
    """A template FROM a Docker Hub image: resolved to its digest here, pulled by the provider, the
    image's Python in the sandbox."""
    template = Template(name="snapgym-live-image", base="python:3.12-slim-bookworm",
                        setup=["python3 --version > /srv/version"], workdir="/srv")  # fmt: skip
    snapshot = live_backend.build(template)  # type: ignore[attr-defined]
    assert snapshot.base == "python:3.12-slim-bookworm"
    with live_backend.create(snapshot) as sandbox:  # type: ignore[attr-defined]
        assert sandbox.read_file("/srv/version").startswith(b"Python 3.12")
