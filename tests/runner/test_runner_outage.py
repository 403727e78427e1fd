"""Outages pause the run instead of burning attempts; the circuit breaker stops it cleanly; a resume finishes it.

Everything here is real: a Ray instance with the real pool (its manager SIGKILLed mid-run), the local
backend (its daemon SIGKILLed while no new backend can be opened), and the model endpoint played by
``chat_server.ChatServer``, a real HTTP server that goes away and comes back on the same port. The
runner is driven in this process (:class:`benchmarks.episodes.evaluation.Evaluation`), or run as a user runs
it (``python -m benchmarks.run``) when the exit status and stderr are the point.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import ray

from benchmarks.agents import LLMAgent, ReplayAgent
from benchmarks.agents.base import EpisodeContext
from benchmarks.episodes.evaluation import EvalSettings, Evaluation
from benchmarks.episodes.outage import OutageError, OutageGate, OutagePolicy, UnreachableError
from benchmarks.episodes.recording.ledger import LEDGER_FILE, Ledger, read_records
from benchmarks.episodes.sources.supply import BackendSupply, PoolSupply, open_sandbox_supply
from benchmarks.reports.results import read_run, summarize_run
from benchmarks.schemas import PoolKind, PoolSettings
from envs.tasks import Task, load_tasks
from pool import LocalBackend
from tests.runner.test_runner_ledger import ScriptedAgent, descendants
from tests.support.fixtures.runner_fixtures import run_benchmark
from tests.support.servers.chat_server import ChatRequest, ChatServer, RawResponse, error_body

pytest_plugins = [
    "tests.support.servers.chat_server",
    "tests.support.fixtures.runner_fixtures",
    "tests.support.fixtures.pool_fixtures",
]

REPO = Path(__file__).resolve().parents[2]
TRIVIAL = REPO / "benchmarks" / "tasks" / "trivial"
SOLVE = "echo ok > /app/answer.txt"
SOLVE_LOG_TASK = "awk '$9 ~ /^5/' /app/access.log | wc -l > /app/answer.txt"
"""Solves runner_fixtures.TASK (the built-in log-error-count)."""


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> list[Task]:
    root = tmp_path_factory.mktemp("outage-suite")
    for task_id in ("alpha", "beta", "gamma"):
        shutil.copytree(TRIVIAL, root / task_id)
    return load_tasks(root)


def solver(solution: str) -> Any:
    """A model that answers the first turn of an episode with ``solution`` and then ``submit``.

    The runner's health probe (one user message) gets ``submit`` too: a valid completion.
    """

    def reply(request: ChatRequest) -> str:
        return f"```bash\n{solution}\n```" if len(request.messages) == 2 else "submit"

    return reply


def results_by_episode(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """episode_id -> its result, asserting there is exactly one per episode."""
    results = [r for r in records if r["kind"] == "result"]
    counts = Counter(r["episode_id"] for r in results)
    assert all(n == 1 for n in counts.values()), f"episodes with several results: {counts}"
    return {r["episode_id"]: r for r in results}


def failed_attempts(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == "attempt_failed"]


def assert_attempt_ids_unique(records: Sequence[dict[str, Any]]) -> None:
    started = [r["attempt_id"] for r in records if r["kind"] == "attempt"]
    assert len(started) == len(set(started)), Counter(started).most_common(3)


# -- the model endpoint -------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_model_endpoint_that_never_answered_stops_the_run_at_once_and_a_resume_finishes(
    tmp_path: Path, runner_store: Path
) -> None:
    """Nothing listens on the endpoint's port from the start: no outage is waited out (it never answered, so
    the address or the server is wrong); the run stops in well under 30 s, with one line naming the URL and
    what to check (exit 3, summary.json), and no attempt counted; once a server listens there, resume=true
    plays every episode."""
    gone = ChatServer()
    port = gone.port
    gone.start()
    gone.close()  # connection refused from now on
    agent = ["agent=llm", f"agent.base_url=http://127.0.0.1:{port}/v1", "agent.model=scripted",
             "agent.api_key_env=", "agent.max_retries=0"]  # fmt: skip
    plan = [*agent, "episodes_per_task=3", "pool.size=3", "max_attempts=2"]  # outage_timeout_s stays 600

    began = time.monotonic()
    stopped = run_benchmark(tmp_path, runner_store, *plan)
    elapsed = time.monotonic() - began
    assert stopped.done.returncode == 3, stopped.done.stderr[-3000:]
    assert stopped.done.stderr.strip().splitlines() == [
        f"snapgym: run stopped: UnreachableError: the model endpoint never answered since the run started "
        f"({stopped.done.stderr.split('started (', 1)[1].split(' s; ', 1)[0]} s; last: http://127.0.0.1:{port}/v1: "
        f"cannot reach the model server ([Errno 111] Connection refused)); is the model server running, and are "
        f"agent.base_url=http://127.0.0.1:{port}/v1 and agent.model=scripted right?"
    ]
    assert elapsed < 60, f"took {elapsed:.0f} s"  # about 10 s of retries; loose, as machines are loaded
    summary = json.loads((stopped.run_dir / "summary.json").read_text())
    assert summary["stopped"].startswith("UnreachableError: the model endpoint never answered")
    assert (summary["counts"]["scheduled"], summary["counts"]["finished"]) == (3, 0)
    records = stopped.ledger()
    assert not [r for r in records if r["kind"] == "result"]
    assert all(r["outage"] for r in failed_attempts(records))  # none counted against max_attempts

    back = ChatServer(solver(SOLVE_LOG_TASK), port=port)
    back.start()
    try:
        resumed = run_benchmark(tmp_path, runner_store, *plan, "resume=true")
    finally:
        back.close()
    summary = resumed.summary()
    assert summary["counts"]["finished"] == summary["counts"]["scored"] == 3
    assert summary["mean_reward"] == 1.0 and "stopped" not in summary
    records = resumed.ledger()
    results = results_by_episode(records)
    assert len(results) == 3
    assert {r["infra_failures"] for r in results.values()} == {0}
    assert_attempt_ids_unique(records)


@pytest.mark.timeout(120)
def test_an_endpoint_that_takes_requests_and_never_replies_stops_the_run_within_30_s(
    tmp_path: Path, runner_store: Path
) -> None:
    """The endpoint accepts connections and never replies (a hung server): no attempt fails before its two-minute
    request timeout, yet the run stops well within 30 s of the episodes' start, with one line naming the URL and
    what to check (exit 3); the episode in flight is cut, not counted, and pending for a resume."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)  # the kernel takes the connections; nobody reads them
        url = f"http://127.0.0.1:{hung.getsockname()[1]}/v1"
        began = time.monotonic()
        stopped = run_benchmark(tmp_path, runner_store, "agent=llm", f"agent.base_url={url}", "agent.model=scripted",
                                "agent.api_key_env=", "pool.size=1")  # fmt: skip
        elapsed = time.monotonic() - began
    assert stopped.done.returncode == 3, stopped.done.stderr[-3000:]
    (line,) = stopped.done.stderr.strip().splitlines()
    assert re.fullmatch(
        r"snapgym: run stopped: UnreachableError: the model endpoint never answered since the run started "
        rf"\(nothing came back in \d+ s; last: {re.escape(url)}: cannot reach the model server \(timed out\)\); "
        rf"is the model server running, and are agent.base_url={re.escape(url)} and agent.model=scripted right\?",
        line,
    ), line
    assert elapsed < 90, f"took {elapsed:.0f} s"  # about 20 s (10 s of silence, a 10 s probe); loose under load
    records = stopped.ledger()
    assert not [r for r in records if r["kind"] == "result"]
    (cut,) = failed_attempts(records)
    assert cut["outage"] and cut["outage_reason"] == "the run stopped during this attempt: UnreachableError"
    assert "the request was cut: the run is stopping" in cut["error"]


@pytest.mark.timeout(120)
def test_an_endpoint_that_answered_then_went_down_says_how_the_outage_stands_until_the_breaker(
    tmp_path: Path, runner_store: Path
) -> None:
    """The endpoint answers the first episode's request, then only 503s: a real outage. While it lasts, stderr
    gets a line at every probe once probes are outage_backoff_max_s apart (at least every 20 s): what is
    down, since when, the next probe and when the run gives up; then the breaker stops the run (exit 3)."""
    answered: list[ChatRequest] = []

    def up_once(request: ChatRequest) -> Any:
        if not answered:
            answered.append(request)
            return "submit"
        return RawResponse(json.dumps(error_body(503)).encode(), status=503)

    server = ChatServer(up_once)
    server.start()
    agent = ["agent=llm", f"agent.base_url={server.base_url}", "agent.model=scripted", "agent.api_key_env=",
             "agent.max_retries=0"]  # fmt: skip
    try:
        began = time.monotonic()
        stopped = run_benchmark(tmp_path, runner_store, *agent, "episodes_per_task=3", "pool.size=1",
                                "outage_timeout_s=4", "outage_backoff_max_s=0.5")  # fmt: skip
        elapsed = time.monotonic() - began
    finally:
        server.close()
    assert stopped.done.returncode == 3, stopped.done.stderr[-3000:]
    lines = stopped.done.stderr.strip().splitlines()
    assert lines[0].startswith("snapgym: outage: the model endpoint: ") and "HTTP 503" in lines[0]
    assert "for up to outage_timeout_s=4 s, saying how it stands at least every 0.5 s" in lines[0]
    status = [line for line in lines if "; down since " in line]
    assert len(status) >= 2, lines  # about one per 0.5 s of the 4 s outage
    for line in status:
        assert line.startswith(f"snapgym: outage: the model endpoint: {server.base_url}: HTTP 503")
        assert re.search(
            r"down since \d\d:\d\d:\d\d UTC \(\d+ s\), \d+ probe\(s\) so far; next probe in \d+ s; "
            r"the run gives up at \d\d:\d\d:\d\d UTC \(outage_timeout_s=4\) unless it serves again$",
            line,
        )
    assert lines[-1].startswith("snapgym: run stopped: OutageError: an outage lasted")
    assert elapsed < 90, f"took {elapsed:.0f} s"
    assert json.loads((stopped.run_dir / "summary.json").read_text())["outages"][0]["resolved"] is False


@pytest.mark.timeout(60)
def test_a_long_pause_between_probes_is_cut_into_reports(
    chat_server: ChatServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A pause between probes longer than report_every_s (as the default 30 s backoff is, against 20 s) still
    says how the outage stands every report_every_s, then the breaker trips as an outage (it answered before)."""
    chat_server.fail_next(503, times=None)
    probe = LLMAgent(base_url=chat_server.base_url, model="scripted", api_key_env="").endpoint_probe()
    policy = OutagePolicy(timeout_s=4.0, first_backoff_s=3.5, max_backoff_s=30.0, report_every_s=1.0)
    gate = OutageGate([probe], policy)
    gate.served()  # an episode ended with a result: the endpoint answered in this run
    assert gate.is_outage(gate.epoch) is not None
    breaker = pytest.raises(OutageError, match=r"past outage_timeout_s=4: the model endpoint: .*HTTP 503")
    with caplog.at_level(logging.WARNING, logger="benchmarks.episodes.outage"), breaker as stop:
        gate.wait(threading.Event())
    assert not isinstance(stop.value, UnreachableError)
    status = [r.getMessage() for r in caplog.records if "; down since " in r.getMessage()]
    assert len(status) >= 2, status  # the 3.5 s pause after the first probe, reported about every second
    assert any(re.search(r"next probe in [1-3] s", line) for line in status), status  # said during the pause


@pytest.mark.timeout(120)
def test_a_ray_cluster_that_never_answered_stops_the_run_at_once(tmp_path: Path) -> None:
    """RAY_ADDRESS names a port nothing listens on: ``ray.init`` alone would wait there without end, in silence;
    the run stops in seconds with one line naming the address and what to check (exit 3, summary.json)."""
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    address = f"127.0.0.1:{port}"
    began = time.monotonic()
    stopped = run_benchmark(tmp_path, None, "pool=ray", env={**os.environ, "RAY_ADDRESS": address})
    elapsed = time.monotonic() - began
    assert stopped.done.returncode == 3, stopped.done.stderr[-3000:]
    (line,) = stopped.done.stderr.strip().splitlines()
    assert line.startswith(f"snapgym: run stopped: UnreachableError: the Ray cluster at RAY_ADDRESS={address} "
                           "never answered since the run started")  # fmt: skip
    assert "Connection refused" in line and "is the cluster running (ray status)" in line
    assert elapsed < 60, f"took {elapsed:.0f} s"
    assert json.loads((stopped.run_dir / "summary.json").read_text())["stopped"].startswith("UnreachableError")


@pytest.mark.timeout(120)
def test_an_endpoint_outage_that_ends_pauses_the_episodes_then_they_score(
    chat_server: ChatServer, tmp_path: Path, tasks: list[Task], backend: LocalBackend
) -> None:
    """Every request fails with 503 for a while: attempts wait with backed-off probes instead of hammering the
    endpoint and burning max_attempts, and every episode scores once the endpoint is back."""
    chat_server.script(solver(SOLVE))
    chat_server.fail_next(503, times=None)
    during_outage: list[int] = []
    done = threading.Event()

    def come_back_2_s_after_the_first_request() -> None:
        while not chat_server.completions() and not done.wait(0.01):
            pass
        done.wait(2.0)
        during_outage.append(len(chat_server.completions()))
        chat_server.stop_failing()

    timer = threading.Thread(target=come_back_2_s_after_the_first_request, daemon=True)
    timer.start()
    agent = LLMAgent(base_url=chat_server.base_url, model="scripted", api_key_env="", max_retries=0)
    supply = BackendSupply(lambda: backend)
    settings = EvalSettings(episodes_per_task=2, concurrency=3, max_attempts=1, outage_timeout_s=60)
    try:
        with Ledger.open(tmp_path) as ledger:
            evaluation = Evaluation(tasks, agent, supply, ledger, settings, probes=[supply, agent.endpoint_probe()])
            evaluation.run()
    finally:
        done.set()
        timer.join()
    records = list(read_records(tmp_path / LEDGER_FILE))
    results = results_by_episode(records)
    assert len(results) == 6
    assert {(r["outcome"], r["reward"], r["infra_failures"]) for r in results.values()} == {("scored", 1.0, 0)}
    failed = failed_attempts(records)
    assert failed and all(r["outage"] and "HTTP 503" in r["error"] for r in failed)
    assert len(failed) <= 3  # one attempt per thread hit the outage; the others waited for it to end
    assert during_outage[0] <= 12  # those attempts plus a few backed-off probes, not a request storm
    (outage,) = evaluation.outages
    assert outage.resolved and "the model endpoint" in outage.reason
    assert_attempt_ids_unique(records)


@pytest.mark.timeout(120)
def test_a_200_with_an_error_body_in_a_run_is_an_infra_failure_retried_not_an_agent_error(
    chat_server: ChatServer, tmp_path: Path, tasks: list[Task], backend: LocalBackend
) -> None:
    """The endpoint answers one request with HTTP 200 and an error object; the probe finds it up, so the
    attempt is an ordinary infrastructure failure (counted, retried) and the episode then scores."""
    first = [True]
    solve = solver(SOLVE)

    def reply(request: ChatRequest) -> Any:
        if first[0]:
            first[0] = False
            return {"error": {"message": "the model server crashed", "type": "server_error"}}
        return solve(request)

    chat_server.script(reply)
    agent = LLMAgent(base_url=chat_server.base_url, model="scripted", api_key_env="", max_retries=0)
    supply = BackendSupply(lambda: backend)
    with Ledger.open(tmp_path) as ledger:
        Evaluation(tasks[:1], agent, supply, ledger, EvalSettings(concurrency=1),
                   probes=[supply, agent.endpoint_probe()]).run()  # fmt: skip
    records = list(read_records(tmp_path / LEDGER_FILE))
    assert [(r["kind"], r["attempt"]) for r in records] == [
        ("attempt", 1), ("attempt_failed", 1), ("attempt", 2), ("result", 2)
    ]  # fmt: skip
    assert "outage" not in records[1]
    assert "ModelUnavailableError" in records[1]["error"] and "server crashed" in records[1]["error"]
    result = records[-1]
    assert (result["outcome"], result["reward"], result["infra_failures"]) == ("scored", 1.0, 1)


# -- the local backend ------------------------------------------------------------------


def kill_the_daemon_and_block_new_backends(runtime: Path, blocked: threading.Event, *, for_s: float | None) -> Any:
    """An agent step that SIGKILLs the backend's daemon after making new backends fail (for ``for_s``)."""

    def step(episode: EpisodeContext) -> str:
        daemons = [pid for pid, (_, args) in descendants(os.getpid()).items() if str(runtime) in args]
        assert len(daemons) == 1, daemons
        blocked.set()
        if for_s is not None:
            threading.Timer(for_s, blocked.clear).start()
        os.kill(daemons[0], signal.SIGKILL)
        return SOLVE

    return step


@pytest.fixture
def blockable_backends(tmp_path: Path, store_dir: Path) -> Iterator[tuple[Any, threading.Event, list[LocalBackend]]]:
    """An opener of real local backends that fails (a store path that is a file) while ``blocked`` is set."""
    runtime, not_a_dir = tmp_path / "runtime", tmp_path / "not-a-directory"
    not_a_dir.write_text("")
    blocked = threading.Event()
    opened: list[LocalBackend] = []

    def open_backend() -> LocalBackend:
        store = not_a_dir / "store" if blocked.is_set() else store_dir
        opened.append(LocalBackend(store_dir=store, runtime_dir=runtime, memory_limit_mb=256, pids_limit=128))
        return opened[-1]

    yield open_backend, blocked, opened
    for backend in opened:
        backend.close()


@pytest.mark.timeout(120)
def test_a_dead_daemon_that_cannot_be_replaced_is_an_outage_until_a_backend_opens(
    tmp_path: Path, tasks: list[Task], blockable_backends: tuple[Any, threading.Event, list[LocalBackend]]
) -> None:
    open_backend, blocked, opened = blockable_backends
    kill = kill_the_daemon_and_block_new_backends(tmp_path / "runtime", blocked, for_s=1.5)
    agent = ScriptedAgent({"alpha": [[kill], [SOLVE]]})
    supply = BackendSupply(open_backend)
    with Ledger.open(tmp_path / "run") as ledger:
        evaluation = Evaluation(tasks[:1], agent, supply, ledger, EvalSettings(concurrency=1, outage_timeout_s=60))
        evaluation.run()
    records = list(read_records(tmp_path / "run" / LEDGER_FILE))
    assert [(r["kind"], r["attempt"]) for r in records] == [
        ("attempt", 1), ("attempt_failed", 1), ("attempt", 2), ("result", 2)
    ]  # fmt: skip
    assert records[1]["outage"] is True
    assert "no new one could be opened" in records[1]["outage_reason"]
    result = records[-1]
    assert (result["outcome"], result["reward"], result["infra_failures"]) == ("scored", 1.0, 0)
    assert evaluation.outages[0].resolved and evaluation.outages[0].probes >= 2
    assert supply.generation == 1 and len([b for b in opened if not b.daemon_has_died]) >= 1


@pytest.mark.timeout(120)
def test_the_breaker_stops_a_run_whose_backend_stays_down_and_the_ledger_stays_resumable(
    tmp_path: Path, tasks: list[Task], blockable_backends: tuple[Any, threading.Event, list[LocalBackend]]
) -> None:
    open_backend, blocked, _ = blockable_backends
    agent = ScriptedAgent(
        {"alpha": [[kill_the_daemon_and_block_new_backends(tmp_path / "runtime", blocked, for_s=None)]]}
    )
    supply = BackendSupply(open_backend)
    settings = EvalSettings(episodes_per_task=2, concurrency=1, outage_timeout_s=1.0)
    stops = pytest.raises(OutageError, match=r"past outage_timeout_s=1: the sandbox backend: .*resume=true")
    with Ledger.open(tmp_path / "run") as ledger, stops:
        Evaluation(tasks[:1], agent, supply, ledger, settings).run()
    records = list(read_records(tmp_path / "run" / LEDGER_FILE))
    assert [(r["kind"], r["episode_id"]) for r in records] == [("attempt", "alpha:0"), ("attempt_failed", "alpha:0")]
    assert records[1]["outage"] is True
    frame, failed = read_run(tmp_path / "run")
    counts = summarize_run(tmp_path / "run", frame, failed, scheduled=2, ks=[1], meta={})["counts"]
    assert (counts["finished"], counts["outage_attempts"], counts["retried_attempts"]) == (0, 1, 0)


# -- the Ray pool ---------------------------------------------------------------------------


def no_direct_backend() -> LocalBackend:
    raise AssertionError("a ray supply opens no backend in the driver")


def actor_pid(handle: Any) -> int:
    return int(ray.get(handle.__ray_call__.remote(lambda actor: os.getpid()), timeout=30))


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(180)
def test_killing_the_pool_manager_mid_run_pauses_recovers_and_loses_no_episode(
    ray_cluster: None, pool_backend_options: dict[str, Any], tmp_path: Path, tasks: list[Task]
) -> None:
    """SIGKILL of the pool's manager actor after 4 results: the runner pauses, the supply starts a new pool,
    and every one of the 24 episodes scores exactly once, none with an attempt counted against it."""
    settings = PoolSettings(kind=PoolKind.ray, size=4, min_warm=1, max_warm=4, max_size=12, lease_ttl_s=10)
    supply = open_sandbox_supply(PoolKind.ray, no_direct_backend, backend_options=pool_backend_options,
                                 pool_settings=settings)  # fmt: skip
    assert isinstance(supply, PoolSupply)
    first_pool = supply.pool
    manager = actor_pid(first_pool._manager)
    results: list[dict[str, Any]] = []

    def kill_after_four(record: dict[str, Any]) -> None:
        results.append(record)
        if len(results) == 4:
            os.kill(manager, signal.SIGKILL)

    agent = ReplayAgent(actions=["sleep 0.2", SOLVE])
    try:
        with Ledger.open(tmp_path) as ledger:
            evaluation = Evaluation(tasks, agent, supply, ledger,
                                    EvalSettings(episodes_per_task=8, concurrency=4, outage_timeout_s=120),
                                    on_result=kill_after_four)  # fmt: skip
            evaluation.run()
        hosts = [h for h in supply.pool.stats()["hosts"] if h["alive"]]
    finally:
        supply.close()
    records = list(read_records(tmp_path / LEDGER_FILE))
    by_episode = results_by_episode(records)
    assert set(by_episode) == {f"{t.id}:{i}" for t in tasks for i in range(8)}
    assert {(r["outcome"], r["reward"], r["infra_failures"]) for r in by_episode.values()} == {("scored", 1.0, 0)}
    failed = failed_attempts(records)
    assert failed, "episodes in flight when the manager died must have failed"
    assert all(r["outage"] for r in failed), [r["error"] for r in failed if not r["outage"]][:3]
    assert "manager is gone" in failed[0]["outage_reason"]
    assert_attempt_ids_unique(records)
    assert supply.generation == 1 and supply.pool is not first_pool and hosts
    (outage,) = evaluation.outages
    assert outage.resolved
    assert not alive(manager)
    summary = summarize_run(tmp_path, *read_run(tmp_path), scheduled=24, ks=[1], meta={})
    assert summary["counts"]["finished"] == summary["counts"]["scored"] == 24
    assert summary["counts"]["outage_attempts"] == len(failed) and summary["counts"]["retried_attempts"] == 0
