"""The E2B backend, through the real ``e2b`` SDK, against the stand-in E2B service (standin.py here),
whose sandboxes are local ones: the conformance suite, the build cache by name, the start digest, the
hand-off, lifetimes and leaks, and the API key kept out of every sandbox."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.attacks.processes import ATTACKS as PROCESS_ATTACKS
from pool import ConfigError, Template
from pool.backends import load_backend, unavailable_reason
from pool.backends.e2b import E2BBackend
from pool.backends.remote import verify
from pool.egress import NetworkPolicy, Phase
from pool.errors import SnapshotCorruptError, UnsupportedError
from pool.labels import OWNER
from pool.testing import check_backend
from pool.verification import VerificationPlan, VerifyMode
from tests.backends.cloud.e2b.standin import E2BStandin

pytest_plugins = ["tests.backends.cloud.e2b.standin"]

TEMPLATE = Template(name="e2b-test", setup=["mkdir -p /w && echo ready > /w/state"], workdir="/w")


@pytest.fixture
def e2b_backend(e2b_standin: E2BStandin) -> Iterator[E2BBackend]:
    with E2BBackend(api_key=e2b_standin.api_key, api_url=e2b_standin.url, sandbox_url=e2b_standin.url) as backend:
        yield backend


def running(standin: E2BStandin) -> list[str]:
    return [sid for sid, record in standin.sandboxes().items() if record.state == "running"]


def test_the_conformance_suite_passes(e2b_backend: E2BBackend) -> None:
    check_backend(e2b_backend)


def test_a_second_build_finds_the_snapshot_by_name_even_in_another_backend(
    e2b_standin: E2BStandin, e2b_backend: E2BBackend
) -> None:
    first = e2b_backend.build(TEMPLATE)
    created = e2b_standin.created_count
    with E2BBackend(api_key=e2b_standin.api_key, api_url=e2b_standin.url, sandbox_url=e2b_standin.url) as other:
        again = other.build(TEMPLATE)
    assert again.digest == first.digest and again.layers == first.layers
    assert e2b_standin.created_count == created  # no build sandbox: found by name
    with e2b_backend.create(first) as sandbox:
        assert sandbox.exec("cat state").stdout == "ready\n"


def test_restore_hands_over_a_fresh_sandbox_and_the_old_one_is_killed(
    e2b_standin: E2BStandin, e2b_backend: E2BBackend
) -> None:
    snapshot = e2b_backend.build(TEMPLATE)
    with e2b_backend.create(snapshot) as sandbox:
        first = sandbox.remote_id
        sandbox.exec("echo dirty > state; (sleep 300 &)")
        sandbox.restore()
        assert sandbox.remote_id != first
        assert sandbox.exec("cat state").stdout == "ready\n"
        deadline = time.monotonic() + 10
        while first in running(e2b_standin) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first not in running(e2b_standin)
    deadline = time.monotonic() + 10
    while running(e2b_standin) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(e2b_standin) == []  # the spare went too


def test_a_snapshot_whose_workdir_changed_at_the_provider_is_refused(
    e2b_standin: E2BStandin, e2b_backend: E2BBackend
) -> None:
    """The workdir digest computed inside each new sandbox must match the one recorded at build."""
    snapshot = e2b_backend.build(TEMPLATE)
    forged = snapshot.__class__(**{**snapshot.to_dict(), "layers": (snapshot.layers[0], "workdir-sha256:" + "0" * 64),
                                   "resources": snapshot.resources})  # fmt: skip
    with pytest.raises(SnapshotCorruptError, match="digest"):
        e2b_backend.create(forged)


def test_every_remote_sandbox_carries_labels_and_a_lifetime(e2b_standin: E2BStandin, e2b_backend: E2BBackend) -> None:
    snapshot = e2b_backend.build(TEMPLATE)
    with e2b_backend.create(snapshot, labels={"snapgym.run": "r1"}) as sandbox:
        record = e2b_standin.sandboxes()[str(sandbox.remote_id)]
        assert record.metadata["snapgym.run"] == "r1" and record.metadata[OWNER] == e2b_backend.owner
        assert record.end_at - time.time() > e2b_backend.sandbox_timeout_s - 60


def test_the_api_key_never_reaches_a_sandbox(e2b_standin: E2BStandin, e2b_backend: E2BBackend) -> None:
    snapshot = e2b_backend.build(TEMPLATE)
    with e2b_backend.create(snapshot) as sandbox:
        seen = sandbox.exec("env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; grep -rs . /w /tmp 2>/dev/null")
        assert e2b_standin.api_key not in seen.stdout + seen.stderr
    assert all(e2b_standin.api_key not in command.command for command in e2b_standin.commands)


def test_a_runner_killed_with_sigkill_leaves_nothing_past_the_lifetime_and_reap_cleans_up(
    e2b_standin: E2BStandin, tmp_path: Path
) -> None:
    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(f"""
        import time
        from pool import Template
        from pool.backends.e2b import E2BBackend
        backend = E2BBackend(api_url={e2b_standin.url!r}, sandbox_url={e2b_standin.url!r}, sandbox_timeout_s=60)
        snap = backend.build(Template(name="e2b-test", setup=["mkdir -p /w && echo ready > /w/state"], workdir="/w"))
        sandbox = backend.create(snap)
        print("ready", flush=True)
        time.sleep(600)
    """)
    )
    env = {**os.environ, "E2B_API_KEY": e2b_standin.api_key, "PYTHONPATH": str(Path(__file__).parents[4])}
    client = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None and client.stdout.readline().strip() == "ready"
    finally:
        client.kill()
        client.wait()
    settled, count = time.monotonic(), e2b_standin.created_count
    while time.monotonic() - settled < 1.0:  # a create of the spare may have been on the wire when the client died
        time.sleep(0.05)
        if e2b_standin.created_count != count:
            settled, count = time.monotonic(), e2b_standin.created_count
    left = running(e2b_standin)
    assert left  # the sandbox (and its spare) are still there: the provider's lifetime is the backstop
    assert all(e2b_standin.sandboxes()[sid].end_at <= time.time() + 61 for sid in left)
    with E2BBackend(api_key=e2b_standin.api_key, api_url=e2b_standin.url, sandbox_url=e2b_standin.url) as reaper:
        assert reaper.reap_orphans() == 1
    assert running(e2b_standin) == []


def test_network_policies_become_e2b_egress_rules(e2b_standin: E2BStandin, e2b_backend: E2BBackend) -> None:
    """Each phase's policy is one atomic update of E2B's egress filter; a sandbox starts with nothing."""
    with e2b_backend.create(e2b_backend.build(TEMPLATE)) as sandbox:
        sandbox.set_network(NetworkPolicy.allowlist(["pypi.org", "*.astral.sh", "203.0.113.0/24"]), phase=Phase.AGENT)
        sandbox.set_network(NetworkPolicy.public(), phase=Phase.VERIFIER)
        sandbox.set_network(NetworkPolicy.offline(), phase=Phase.VERIFIER)
        sent = e2b_standin.sandboxes()[str(sandbox.remote_id)].network
        with pytest.raises(UnsupportedError, match="not port"):
            sandbox.set_network(NetworkPolicy.allowlist(["pypi.org:443"]), phase=Phase.AGENT)
        assert sandbox.network_log().connections == ()  # E2B records nothing: egress_audit is False
    assert sent[0] == {"allow_internet_access": False}
    # as E2B's API has them on the wire
    assert sent[1] == {"allowOut": ["pypi.org", "*.astral.sh", "203.0.113.0/24"], "denyOut": ["0.0.0.0/0"]}
    assert "10.0.0.0/8" in sent[2]["denyOut"] and "169.254.0.0/16" in sent[2]["denyOut"]
    assert "allowOut" not in sent[2]  # public: everything else
    assert sent[3] == {"denyOut": ["0.0.0.0/0"]}
    assert e2b_backend.capabilities.egress_control == "provider" and not e2b_backend.capabilities.egress_audit


def test_what_it_cannot_do_yet_is_refused_not_faked(e2b_backend: E2BBackend) -> None:
    capabilities = e2b_backend.capabilities
    assert capabilities.verification == ("strict",)
    with e2b_backend.create(e2b_backend.build(TEMPLATE)) as sandbox:
        plan = VerificationPlan(VerifyMode.SHARED, tests_dir=Path(__file__).parent)
        with pytest.raises(UnsupportedError, match="strict"):
            sandbox.begin_verification(plan)
        plan = VerificationPlan(VerifyMode.TOOLCHAIN, tests_dir=Path(__file__).parent, outputs=("/w",))
        with pytest.raises(UnsupportedError, match="toolchain mode needs a list of the agent's changes"):
            sandbox.begin_verification(plan)
    with pytest.raises(ConfigError, match="not in a registry"):  # a provider pulls images from registries only
        e2b_backend.build(Template(name="from-archive", base="docker-archive:/nowhere/image.tar"))


def test_strict_verification_stops_the_episodes_processes_before_it_collects(
    e2b_backend: E2BBackend, tmp_path: Path
) -> None:
    """Writers the agent left running (one that cleared its environment too) are killed before the
    archive is made, so the verifier gets the outputs as they were, complete, and nothing runs on."""
    (tmp_path / "test.sh").write_text("#!/bin/sh\n")
    with e2b_backend.create(e2b_backend.build(TEMPLATE)) as sandbox:
        sandbox.exec("echo answer > /w/result")
        left = sandbox.exec(
            "setsid sh -c 'while :; do date >> /w/log; done' </dev/null >/dev/null 2>&1 & "
            "env -i setsid /bin/sh -c 'while :; do echo x >> /w/quiet; sleep 0.01; done' </dev/null >/dev/null 2>&1 & "
            "sleep 0.3; echo started"
        )
        assert left.stdout.strip() == "started"
        plan = VerificationPlan(VerifyMode.STRICT, tmp_path, outputs=("/w",))
        collected = verify.collect_outputs(sandbox, plan)  # the first half of begin_verification
        assert collected.carried == ("/w",) and collected.notes == ()
        assert sandbox.exec("pgrep -f 'w/l[o]g|w/qu[i]et'").stdout == ""  # in the agent's sandbox: all gone
        first = sandbox.read_file("/w/log")
        time.sleep(0.3)
        assert sandbox.read_file("/w/log") == first
        report = sandbox.begin_verification(plan)
        assert report.notes == () and report.missing_outputs == ()
        assert sandbox.read_file("/w/result") == b"answer\n"


def test_a_collector_step_the_agent_turned_into_another_program_is_not_taken_for_done(
    e2b_backend: E2BBackend, tmp_path: Path
) -> None:
    """The catalogue's ptrace attacker turns each new process into a shell that exits 0. The step that
    stops the episode's processes must not pass for done then (the attacker would live on into the
    archiving): either it is caught (outputs empty, the note says why), or the step really ran and the
    attacker is dead. It once went unnoticed and, when the attacker left the archiving shell stopped,
    the verification hung for the archive's timeout."""
    (tmp_path / "test.sh").write_text("#!/bin/sh\n")
    attack = next(candidate for candidate in PROCESS_ATTACKS if candidate.name == "ptrace-verifier")
    with e2b_backend.create(e2b_backend.build(TEMPLATE)) as sandbox:
        sandbox.exec("echo answer > /w/result")
        for action in attack.actions[:-1]:  # all but the submit
            assert sandbox.exec(action).stdout.strip().endswith("armed")
        collected = verify.collect_outputs(sandbox, VerificationPlan(VerifyMode.STRICT, tmp_path, outputs=("/w",)))
        if collected.notes:  # the attacker won the race: caught
            assert collected.carried == () and collected.missing == ("/w",), collected
            assert len(collected.notes) == 1 and "could not be stopped" in collected.notes[0], collected.notes
        else:  # the stop step won it: the attacker is gone (a live one would turn this check into a forger)
            assert collected.carried == ("/w",), collected
            look = sandbox.run_direct(
                "for p in /proc/[0-9]*; do grep -qas '[.]ptrace[.]py' $p/cmdline && echo alive; done; echo looked",
                timeout_s=30,
            )
            assert look.stdout.splitlines() == ["looked"], look


def test_a_sandbox_that_will_not_give_up_its_outputs_is_scored_with_them_empty(
    e2b_backend: E2BBackend, tmp_path: Path
) -> None:
    """A full disk keeps the archive from being made: the agent's doing, so the verifier sees empty
    outputs and the report says why, rather than an unscored infrastructure error."""
    (tmp_path / "test.sh").write_text("#!/bin/sh\n")
    with e2b_backend.create(e2b_backend.build(TEMPLATE)) as sandbox:
        sandbox.exec("echo answer > /w/result; cat /dev/zero > /fill 2>/dev/null; cat /dev/zero > /tmp/x 2>/dev/null")
        report = sandbox.begin_verification(VerificationPlan(VerifyMode.STRICT, tmp_path, outputs=("/w",)))
        assert report.missing_outputs == ("/w",)
        assert len(report.notes) == 1 and "did not give up its outputs" in report.notes[0], report.notes
        assert sandbox.exec("ls -A /w").stdout == ""


def test_without_a_key_the_backend_says_which_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    reason = unavailable_reason("e2b")
    assert reason is not None and "E2B_API_KEY" in reason
    with pytest.raises(ConfigError, match="E2B_API_KEY"):
        load_backend("e2b")


def test_a_wrong_key_is_a_config_error_naming_it(e2b_standin: E2BStandin) -> None:
    with (
        E2BBackend(api_key="e2b_wrong", api_url=e2b_standin.url, sandbox_url=e2b_standin.url) as backend,
        pytest.raises(ConfigError, match="E2B_API_KEY"),
    ):
        backend.build(TEMPLATE)


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("noop", 0.0)])
def test_the_runner_scores_builtin_tasks_on_e2b(
    e2b_standin: E2BStandin, tmp_path: Path, agent: str, reward: float
) -> None:
    """``python -m benchmarks.run backend=e2b``: the reference solution scores 1.0 and doing nothing 0.0,
    verified strictly in a fresh E2B sandbox; the API key reaches the runner by its usual variable."""
    import json

    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "backend=e2b", f"backend.api_url={e2b_standin.url}",
         f"backend.sandbox_url={e2b_standin.url}", f"agent={agent}", "suite.include=[csv-sales-summary,git-*]",
         "suite.limit=2", "progress=false", "benchmark.plots=false", f"output_dir={run_dir}",
         f"hydra.run.dir={tmp_path / 'hydra'}"],
        cwd=Path(__file__).parents[4], env={**os.environ, "E2B_API_KEY": e2b_standin.api_key},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mean_reward"] == reward and summary["counts"].get("scored") == 2, summary
    assert e2b_standin.api_key not in (run_dir / "ledger.jsonl").read_text()
    results = [r for r in map(json.loads, (run_dir / "ledger.jsonl").read_text().splitlines()) if r["kind"] == "result"]
    assert all(r["provider"] == "e2b" and r["sandbox_id"] and r["sandbox_s"] > 0 for r in results)
    for result in results:  # no end-state diff the agent could forge: the episode's diff.json says so
        diff = json.loads((run_dir / result["files"]["diff"]).read_text())
        assert diff == {"unavailable": "the e2b backend cannot list them outside the sandbox"}
    assert summary["sandbox_seconds"]["by_provider"]["e2b"] == pytest.approx(sum(r["sandbox_s"] for r in results))
    deadline = time.monotonic() + 15
    while running(e2b_standin) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running(e2b_standin) == []  # the run closed every sandbox it made


def test_pool_reap_destroys_a_runs_sandboxes_by_label(
    e2b_standin: E2BStandin,
    e2b_backend: E2BBackend,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pool.backends.reap import main

    snapshot = e2b_backend.build(TEMPLATE)
    gone = e2b_backend.create(snapshot, labels={"snapgym.run": "r7"})
    kept = e2b_backend.create(snapshot, labels={"snapgym.run": "r8"})
    monkeypatch.setenv("E2B_API_KEY", e2b_standin.api_key)
    endpoint = ["-o", f"api_url={e2b_standin.url}", "-o", f"sandbox_url={e2b_standin.url}"]
    assert main(["--backend", "e2b", "--run", "r7", "--dry-run", *endpoint]) == 0
    assert str(gone.remote_id) in capsys.readouterr().out and str(gone.remote_id) in running(e2b_standin)
    assert main(["--backend", "e2b", "--run", "r7", *endpoint]) == 0
    assert "destroyed 2 sandbox(es) of run r7" in capsys.readouterr().out  # the sandbox and its spare
    assert str(gone.remote_id) not in running(e2b_standin) and str(kept.remote_id) in running(e2b_standin)
    assert main(["--backend", "e2b", "--run", "r7", "-o", "nonsense"]) == 2


def test_refused_creates_are_retried_with_one_idempotency_key(e2b_standin: E2BStandin, e2b_backend: E2BBackend) -> None:
    """429s past the SDK's own retries, then a 503, then success: one sandbox, one key on every attempt."""
    snapshot = e2b_backend.build(TEMPLATE)
    e2b_backend.prewarm = False
    before = len(e2b_standin.requests)
    e2b_standin.fail_next("POST", "/v2/sandboxes", 429, count=5, retry_after=0)
    e2b_standin.fail_next("POST", "/v2/sandboxes", 503, count=1, retry_after=0)
    created = e2b_standin.created_count
    with e2b_backend.create(snapshot) as sandbox:
        assert sandbox.exec("cat state").stdout == "ready\n"
    creates = [r for r in e2b_standin.requests[before:] if r.method == "POST" and r.path == "/v2/sandboxes"]
    assert len(creates) >= 7 and creates[-1].status == 201
    assert len({r.headers["idempotency-key"] for r in creates}) == 1
    assert e2b_standin.created_count == created + 1


def test_a_shared_pace_keeps_a_burst_under_the_providers_limit(e2b_standin: E2BStandin, tmp_path: Path) -> None:
    """Two backends (as two processes of a run would) share one bucket file: no 429 from a provider
    that allows 4 creations a second."""
    options = {"api_key": e2b_standin.api_key, "api_url": e2b_standin.url, "sandbox_url": e2b_standin.url,
               "max_creates_per_s": 3.0, "create_burst": 1, "rate_limit_file": str(tmp_path / "bucket"),
               "prewarm": False}  # fmt: skip
    e2b_standin.max_creates_per_s = 4
    with E2BBackend(**options) as first, E2BBackend(**options) as second:
        snapshot = first.build(TEMPLATE)
        before = len(e2b_standin.requests)
        started = time.monotonic()
        made = first.fork(snapshot, 4) + second.fork(snapshot, 4)
        elapsed = time.monotonic() - started
        for sandbox in made:
            sandbox.close()
    statuses = [r.status for r in e2b_standin.requests[before:] if r.path == "/v2/sandboxes" and r.method == "POST"]
    assert statuses.count(429) == 0 and statuses.count(201) == 8
    assert elapsed >= 7 / 3 * 0.9  # 8 creations at 3/s after a burst of 1


def test_a_spare_that_waited_through_half_its_lifetime_is_replaced(
    e2b_standin: E2BStandin, e2b_backend: E2BBackend
) -> None:
    """Restore never hands over a sandbox whose provider lifetime could end under the episode."""
    snapshot = e2b_backend.build(TEMPLATE)
    e2b_backend.spare_max_age_s = 0.5
    with e2b_backend.create(snapshot) as sandbox:
        time.sleep(1.0)  # the spare is ready, and now old
        created = e2b_standin.created_count
        old_spares = set(running(e2b_standin)) - {sandbox.remote_id}
        sandbox.restore()
        assert sandbox.remote_id not in old_spares  # a fresh sandbox, not the old spare
        assert e2b_standin.created_count >= created + 1
        assert sandbox.exec("cat state").stdout == "ready\n"
