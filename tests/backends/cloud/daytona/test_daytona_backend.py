"""The Daytona backend, through the real ``daytona`` SDK, against the stand-in Daytona service
(tests/backends/cloud/daytona/standin.py), whose sandboxes are local ones: the conformance suite, builds found by
name, hand-offs, lifetimes and labels, egress settings, retries the SDK does not do, the runner, reaping
and the API key kept out of every sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import ConfigError, Template
from pool.backends import load_backend, unavailable_reason
from pool.backends.daytona import DaytonaBackend
from pool.egress import NetworkPolicy, Phase
from pool.errors import UnsupportedError
from pool.labels import OWNER
from pool.testing import check_backend
from tests.backends.cloud.daytona.standin import DaytonaStandin

pytest_plugins = ["tests.backends.cloud.daytona.standin"]

TEMPLATE = Template(name="daytona-test", setup=["mkdir -p /w && echo ready > /w/state"], workdir="/w")


def options(standin: DaytonaStandin, **more: object) -> dict[str, object]:
    return {"api_key": standin.api_key, "api_url": standin.url, "target": "us", **more}


@pytest.fixture
def daytona_backend(daytona_standin: DaytonaStandin) -> Iterator[DaytonaBackend]:
    with DaytonaBackend(**options(daytona_standin)) as backend:  # type: ignore[arg-type]
        yield backend


def live(standin: DaytonaStandin) -> list[str]:
    return [sid for sid, record in standin.sandboxes().items() if record.state not in ("destroyed",)]


def settle(standin: DaytonaStandin, *, at_most: int = 0, within_s: float = 15) -> list[str]:
    deadline = time.monotonic() + within_s
    while len(left := live(standin)) > at_most and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_the_conformance_suite_passes(daytona_backend: DaytonaBackend) -> None:
    check_backend(daytona_backend)


def test_a_second_build_finds_the_snapshot_by_name(daytona_standin: DaytonaStandin) -> None:
    with DaytonaBackend(**options(daytona_standin)) as first:  # type: ignore[arg-type]
        snapshot = first.build(TEMPLATE)
    created = daytona_standin.created_count
    with DaytonaBackend(**options(daytona_standin)) as second:  # type: ignore[arg-type]
        again = second.build(TEMPLATE)
        assert again.layers == snapshot.layers and again.digest == snapshot.digest
        assert daytona_standin.created_count == created  # found by name: no build sandbox
        with second.create(again) as sandbox:
            assert sandbox.exec("cat state").stdout == "ready\n"


def test_restore_hands_over_and_every_sandbox_is_ephemeral_labelled_and_offline(
    daytona_standin: DaytonaStandin, daytona_backend: DaytonaBackend
) -> None:
    snapshot = daytona_backend.build(TEMPLATE)
    with daytona_backend.create(snapshot, labels={"snapgym.run": "r1"}) as sandbox:
        first = sandbox.remote_id
        sandbox.exec("echo dirty > state; (sleep 300 &)")
        sandbox.restore()
        assert sandbox.remote_id != first and sandbox.exec("cat state").stdout == "ready\n"
        record = daytona_standin.sandboxes()[str(sandbox.remote_id)]
        assert record.labels["snapgym.run"] == "r1" and record.labels[OWNER] == daytona_backend.owner
        assert record.auto_delete_interval == 0  # ephemeral: deleted when it stops
        assert record.ttl_minutes == 60 and record.network.get("networkBlockAll") is True
    assert settle(daytona_standin) == []


def test_network_policies_become_daytona_egress_settings(
    daytona_standin: DaytonaStandin, daytona_backend: DaytonaBackend
) -> None:
    with daytona_backend.create(daytona_backend.build(TEMPLATE)) as sandbox:
        sandbox.set_network(NetworkPolicy.allowlist(["pypi.org", "*.astral.sh", "203.0.113.0/24"]), phase=Phase.AGENT)
        allowlisted = dict(daytona_standin.sandboxes()[str(sandbox.remote_id)].network)
        sandbox.set_network(NetworkPolicy.public(), phase=Phase.VERIFIER)
        public = dict(daytona_standin.sandboxes()[str(sandbox.remote_id)].network)
        with pytest.raises(UnsupportedError, match="not port"):
            sandbox.set_network(NetworkPolicy.allowlist(["pypi.org:443"]), phase=Phase.AGENT)
    assert allowlisted.get("networkAllowList") == "203.0.113.0/24"
    assert allowlisted.get("domainAllowList") == "pypi.org,*.astral.sh"
    assert public.get("networkBlockAll") is False


def test_refused_creates_are_retried_here_because_the_sdk_does_not(
    daytona_standin: DaytonaStandin, daytona_backend: DaytonaBackend
) -> None:
    snapshot = daytona_backend.build(TEMPLATE)
    daytona_backend.prewarm = False
    daytona_standin.fail_next("POST", "/sandbox", 429, count=2, retry_after=0)
    daytona_standin.fail_next("POST", "/sandbox", 503, count=1)
    with daytona_backend.create(snapshot) as sandbox:
        assert sandbox.exec("cat state").stdout == "ready\n"


def test_a_create_whose_answer_was_lost_is_not_made_twice(
    daytona_standin: DaytonaStandin, daytona_backend: DaytonaBackend
) -> None:
    """Daytona has no idempotency key: the create's name is the key, and the retry takes that sandbox."""
    snapshot = daytona_backend.build(TEMPLATE)
    daytona_backend.prewarm = False
    before = daytona_standin.created_count
    daytona_standin.fail_next("POST", "/sandbox", 503, count=1, after=True)
    with daytona_backend.create(snapshot):
        assert daytona_standin.created_count == before + 1


def test_the_api_key_never_reaches_a_sandbox(daytona_standin: DaytonaStandin, daytona_backend: DaytonaBackend) -> None:
    with daytona_backend.create(daytona_backend.build(TEMPLATE)) as sandbox:
        seen = sandbox.exec("env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; grep -rs . /w /tmp 2>/dev/null")
        assert daytona_standin.api_key not in seen.stdout + seen.stderr
    assert all(daytona_standin.api_key not in str(command) for command in daytona_standin.commands)


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("noop", 0.0)])
def test_the_runner_scores_builtin_tasks_on_daytona(
    daytona_standin: DaytonaStandin, tmp_path: Path, agent: str, reward: float
) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "backend=daytona", f"backend.api_url={daytona_standin.url}",
         "backend.target=us", f"agent={agent}", "suite.include=[csv-sales-summary,git-*]", "suite.limit=2",
         "progress=false", "benchmark.plots=false", f"output_dir={run_dir}", f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=Path(__file__).parents[4], env={**os.environ, "DAYTONA_API_KEY": daytona_standin.api_key},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mean_reward"] == reward and summary["counts"].get("scored") == 2, summary
    assert summary["sandbox_seconds"]["by_provider"]["daytona"] > 0
    assert daytona_standin.api_key not in (run_dir / "ledger.jsonl").read_text()
    assert settle(daytona_standin) == []


def test_pool_reap_ends_a_runs_sandboxes(
    daytona_standin: DaytonaStandin, daytona_backend: DaytonaBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pool.backends.reap import main

    snapshot = daytona_backend.build(TEMPLATE)
    gone = daytona_backend.create(snapshot, labels={"snapgym.run": "r7"})
    kept = daytona_backend.create(snapshot, labels={"snapgym.run": "r8"})
    monkeypatch.setenv("DAYTONA_API_KEY", daytona_standin.api_key)
    assert main(["--backend", "daytona", "--run", "r7", "-o", f"api_url={daytona_standin.url}", "-o", "target=us"]) == 0
    assert str(gone.remote_id) not in live(daytona_standin) and str(kept.remote_id) in live(daytona_standin)


def test_without_a_key_the_backend_says_which_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DAYTONA_API_KEY", raising=False)
    reason = unavailable_reason("daytona")
    assert reason is not None and "DAYTONA_API_KEY" in reason
    with pytest.raises(ConfigError, match="DAYTONA_API_KEY"):
        load_backend("daytona")


def test_a_wrong_key_is_a_config_error_naming_it(daytona_standin: DaytonaStandin) -> None:
    with (
        DaytonaBackend(**{**options(daytona_standin), "api_key": "wrong"}) as backend,  # type: ignore[arg-type]
        pytest.raises(ConfigError, match="DAYTONA_API_KEY"),
    ):
        backend.build(TEMPLATE)
