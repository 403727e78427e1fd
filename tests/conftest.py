"""Shared fixtures: one local backend per test session, over a temporary store, and
``any_backend``: the backend matrix (:func:`tests.support.backends.backend_params`), for the tests
of the contract. Which tests are ``slow`` (:data:`SLOW`): the default run leaves them out, ``-m slow``
runs them. And the ``needs`` mark (:mod:`tests.support.needs`): a test that needs something this
machine lacks skips, or fails under ``SNAPGYM_REQUIRE_ALL=1``. And ``--record-conformance PATH``
(:mod:`tests.support.recording`): the run records how the conformance suite and the attack catalogue
went on each backend."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import Backend, LocalBackend, Snapshot, load_backend
from tests.support.backends import BACKEND_OPTIONS, LIMITS, WORKSPACE_TEMPLATE, backend_params
from tests.support.needs import MARKER, check_needs

pytest_plugins = ["tests.support.recording"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(reason, required=None): needs something this machine may lack (reason: None when it has it); "
        "skips, or fails under SNAPGYM_REQUIRE_ALL=1 (tests/support/needs.py)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (or fail, where required) a test whose ``needs`` mark is unmet, before its fixtures start."""
    check_needs(item)


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


@pytest.fixture(scope="session", params=backend_params())
def any_backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """Each backend of the matrix, with the test limits (one this machine cannot run skips)."""
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


SLOW = {
    "tests/contract/test_clean_starts.py::*": "twenty sabotaged episodes in a row; 1.5 M files",
    "tests/cluster/test_pool_cluster.py::*": "two- and three-node Ray clusters started per test",
    "tests/backends/docker/test_docker_builtin_suite.py::*": "the whole built-in suite on Docker",
    "tests/cluster/test_pool_store.py::test_every_host_uses_the_store_the_driver_configured": "a Ray cluster",
    "tests/verifier/test_builtin_verifiers.py::*slow-binary*": "an attack that waits out its own timeouts",
    "tests/attacks/test_verifier_attacks.py::*inode-exhaustion*": "fills a filesystem's inodes",
    "tests/attacks/test_verifier_attacks.py::test_attack_scores_what_doing_nothing_scores[e2b-*": (
        "the catalogue through the E2B stand-in: a cloud create, hand-off and strict verification each"
    ),
    "tests/verifier/test_attribution.py::*exhaust inodes*": "fills a filesystem's inodes",
    "tests/runner/test_benchmark_smoke.py::test_pool_benchmark_reports_every_method": "warms hundreds of sandboxes",
    "tests/runner/test_benchmark_smoke.py::test_reset_latency_reports_every_method": "every method, Docker included",
    "tests/runner/test_runner_ledger.py::test_a_killed_run_resumes_to_exactly_one_result_per_episode": "kills runs",
    "tests/runner/test_runner_outage.py::test_killing_the_pool_manager_mid_run_*": "a Ray pool killed and replaced",
    "tests/runner/test_notebooks.py::test_notebook_runs_top_to_bottom[[]03_*": "trains a policy: 600 episodes",
    "tests/viewer/test_viewer.py::test_every_episode_of_a_21_task_run_*": "the 21 built-in tasks and 21 episode pages",
    "tests/train/test_trl_grpo.py::*": "TRL's GRPOTrainer trains a model for three steps on 24 episodes",
    "tests/backends/local/test_memory_cgroups.py::*": "200 episodes, counting the host's memory cgroups",
    "tests/runner/test_cost.py::test_the_cost_scenario_*": "five segments twice and the kernel operations",
    "tests/runner/test_soak.py::test_the_soak_reports_*": "two windows and a fresh backend's, each with a warm-up",
    "tests/egress/test_network_tasks.py::test_a_later_download_that_fails_is_never_a_silent_zero": (
        "an episode and three runs behind the egress proxy"
    ),
    "tests/runner/test_runner_outage.py::test_an_endpoint_that_takes_requests_and_never_replies_*": (
        "waits out the run's first contact with the endpoint (10 s) and its probe (10 s)"
    ),
    "tests/backends/cloud/test_cloud_task_images.py::test_a_tb2_task_builds_*[[]daytona]": "builds a task's image",
    "tests/backends/cloud/test_cloud_task_images.py::test_a_tb2_task_builds_*[[]modal]": "builds a task's image",
    "tests/attacks/test_integrity_benchmark.py::test_an_audit_flags_a_known_limitation_*": "pytest in strict sandboxes",
    "tests/runner/test_runner_processes.py::test_a_killed_worker_is_replaced_*[[]both]": "kills both workers mid-run",
    "tests/runner/test_durable_episodes.py::test_a_docker_episode_goes_on_from_the_checkpoint_*": (
        "a runner killed mid-episode on Docker and its resume"
    ),
    "tests/verifier/test_real_swe_targets.py::test_a_harness_attack_*[[]six-pytest-[as]*": (
        "pytest on six, with and without the protection (its report-hook case stays)"
    ),
    "tests/verifier/test_real_swe_targets.py::test_a_harness_attack_*[[]more-itertools-pytest-[rs]*": (
        "pytest on more-itertools, with and without the protection (its addopts-plugin case stays)"
    ),
    "tests/verifier/test_real_swe_targets.py::test_a_harness_attack_*[[]toolz-pytest-[ra]*": (
        "pytest on toolz, with and without the protection (its shadow-package case stays)"
    ),
}
"""The default run's longest tests (node id patterns, and why they take long), most over about 10 s
each; a parametrised test keeps a representative case or two in the default run. The attack
catalogue marks its own (tests/attacks/test_verifier_attacks.py: the cloud stand-ins past SAMPLE,
the tasks with slow verifiers past SLOW_VERIFIER_SAMPLE). The default run leaves them out
(``-m 'not slow'`` in pyproject's addopts) to stay well under 15 minutes on CI's 2 cores; CI runs
them too, serially, after the default run (``python -m pytest -m slow -n 0``), in about half an hour."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests :data:`SLOW` names as ``slow``."""
    for item in items:
        if any(fnmatch.fnmatchcase(item.nodeid, pattern) for pattern in SLOW):
            item.add_marker(pytest.mark.slow)
