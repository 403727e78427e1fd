"""Several runner processes on one ledger (``processes=N``, issue 34 item 6): every episode ends exactly once.

``python -m benchmarks.run`` runs as a user runs it, with two worker processes that claim episodes from
the parent, which writes the ledger. Real SIGKILLs land on one worker mid-episode, on one as it starts,
on both workers at once, and on the parent alone (its workers must die with it); an agent class that
kills the process playing one task makes that episode kill every worker that takes it. After each, the
run (or its resume) ends every scheduled episode with exactly one result, every attempt closed once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.agents.base import EpisodeContext, ModelRequestError, Observation
from benchmarks.episodes.recording.ledger import LEDGER_FILE, read_records
from benchmarks.episodes.settings import EvalSettings
from envs import SUBMIT
from pool import ConfigError
from tests.runner.test_runner_ledger import (
    CLI_EPISODES_PER_TASK,
    CLI_PLAN,
    REPO,
    SOLVE,
    TASK_IDS,
    assert_every_attempt_closed_once,
    descendants,
    ledger_state,
    results_by_episode,
    run_to_the_end,
    runner,
    still_running,
    suite_dir,
)

__all__ = ["suite_dir"]  # the fixture, shared with the ledger tests

PLANNED = {f"{task}:{i}" for task in TASK_IDS for i in range(CLI_EPISODES_PER_TASK)}
TWO = [*CLI_PLAN, "processes=2"]
"""The ledger tests' 36 episodes of ~0.35 s, two at a time, in two worker processes."""


def workers(parent: int) -> dict[int, tuple[str, str]]:
    """The worker processes of the runner ``parent`` (spawned interpreters)."""
    return {pid: info for pid, info in descendants(parent).items() if "spawn_main" in info[1]}


def start(tmp: Path, store: Path, *overrides: str) -> subprocess.Popen[bytes]:
    with (tmp / f"runner-{time.monotonic_ns()}.log").open("w") as log:
        return subprocess.Popen(runner(tmp, store, *overrides), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def wait_until(proc: subprocess.Popen[bytes], ready: Any, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, f"the runner ended before {what}"
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.02)


def finish(proc: subprocess.Popen[bytes], timeout_s: float = 180) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def assert_gone(processes: Mapping[int, tuple[str, str]]) -> None:
    deadline = time.monotonic() + 15  # the kernel and the daemons notice their parent is gone; not a timing test
    while (alive := still_running(processes)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive == {}, f"still running: {alive}"


@dataclass(frozen=True, slots=True)
class TwoWorkerRun:
    """A runner started in the background with two worker processes, on the ledger tests' suite."""

    proc: subprocess.Popen[bytes]
    run_dir: Path

    @property
    def ledger(self) -> Path:
        return self.run_dir / LEDGER_FILE

    def wait_until_midway(self) -> None:
        """Until four results are written and an attempt is in flight (a kill then cuts one)."""

        def midway() -> bool:
            state = ledger_state(self.ledger)
            return len(state.results) >= 4 and bool(state.unfinished)

        wait_until(self.proc, midway, "four results and one in flight")


@pytest.fixture
def two_workers(tmp_path: Path, store_dir: Path, suite_dir: Path) -> Iterator[TwoWorkerRun]:
    """The runner started with ``processes=2`` (TWO) on the ledger tests' suite; killed, group and all,
    if a test leaves it running."""
    run_dir = tmp_path / "run"
    proc = start(tmp_path, store_dir, *TWO, f"suite.path={suite_dir}", f"output_dir={run_dir}")
    try:
        yield TwoWorkerRun(proc, run_dir)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def assert_exactly_once(ledger: Path) -> list[dict[str, Any]]:
    records = list(read_records(ledger))
    results = results_by_episode(records)
    assert set(results) == PLANNED
    assert_every_attempt_closed_once(records)
    return records


def test_two_processes_play_every_episode_once_as_one_session(tmp_path: Path, store_dir: Path, suite_dir: Path) -> None:
    run_dir = tmp_path / "run"
    done = run_to_the_end(tmp_path, store_dir, *TWO, f"suite.path={suite_dir}", f"output_dir={run_dir}")
    assert f"episodes {len(PLANNED)}/{len(PLANNED)}" in done.stdout
    records = assert_exactly_once(run_dir / LEDGER_FILE)
    assert [r["kind"] for r in records].count("attempt") == len(PLANNED)  # nothing was played twice
    assert len({r["run_id"] for r in records}) == 1  # the workers write as the parent's session
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["counts"]["scored"] == len(PLANNED) and summary["mean_reward"] == 1.0
    assert list((tmp_path / "runtime").iterdir()) == []  # every worker closed its sandboxes


@pytest.mark.parametrize("when", ["mid-episode", "starting", "both"])
def test_a_killed_worker_is_replaced_and_its_episode_is_played_again_once(
    tmp_path: Path, two_workers: TwoWorkerRun, when: str
) -> None:
    proc = two_workers.proc
    if when == "starting":  # as soon as the workers exist: before or while they open their backends
        wait_until(proc, lambda: len(workers(proc.pid)) == 2, "two workers")
    else:
        two_workers.wait_until_midway()
    found = workers(proc.pid)
    victims = sorted(found) if when == "both" else sorted(found)[:1]
    doomed = {pid: info for v in victims for pid, info in descendants(v).items()} | {v: found[v] for v in victims}
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    assert_gone(doomed)  # the worker, its sandbox daemon and its sandboxes' processes
    assert finish(proc) == 0
    records = assert_exactly_once(two_workers.ledger)
    failed = [r for r in records if r["kind"] == "attempt_failed"]
    assert all("was killed by SIGKILL" in r["error"] and not r["interrupted"] for r in failed)
    results = results_by_episode(records)
    for record in failed:  # counted as the episode's infrastructure failing, and played again
        assert results[record["episode_id"]]["attempt"] > record["attempt"]
        assert results[record["episode_id"]]["infra_failures"] >= 1
    if when != "starting":
        assert failed, "the kill cut no attempt"
    assert {r["outcome"] for r in results.values()} == {"scored"}
    assert list((tmp_path / "runtime").iterdir()) == []


def test_a_killed_parent_takes_its_workers_with_it_and_a_resume_ends_every_episode_once(
    tmp_path: Path, store_dir: Path, two_workers: TwoWorkerRun
) -> None:
    proc, ledger = two_workers.proc, two_workers.ledger
    two_workers.wait_until_midway()
    everything = descendants(proc.pid)
    assert len(workers(proc.pid)) == 2
    os.kill(proc.pid, signal.SIGKILL)  # the parent alone, not its process group
    proc.wait()
    assert_gone(everything)
    cut = ledger_state(ledger)
    assert cut.unfinished and len(cut.results) < len(PLANNED)
    done = run_to_the_end(tmp_path, store_dir, f"resume={two_workers.run_dir}", "processes=2")
    assert f"episodes {len(PLANNED)}/{len(PLANNED)}" in done.stdout
    records = assert_exactly_once(ledger)
    interrupted = {(r["episode_id"], r["attempt"]) for r in records if r["kind"] == "attempt_failed"}
    assert interrupted == set(cut.unfinished.items())
    assert all(r["interrupted"] for r in records if r["kind"] == "attempt_failed")


def test_ctrl_c_stops_every_worker_cleanly_and_the_resume_finishes(
    tmp_path: Path, store_dir: Path, two_workers: TwoWorkerRun
) -> None:
    proc, ledger, run_dir = two_workers.proc, two_workers.ledger, two_workers.run_dir
    two_workers.wait_until_midway()
    everything = descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
    assert finish(proc) == 130
    assert_gone(everything)
    stopped = ledger_state(ledger)
    assert not stopped.unfinished  # every attempt in flight was closed as interrupted
    assert json.loads((run_dir / "summary.json").read_text())["state"] == "interrupted"
    run_to_the_end(tmp_path, store_dir, f"resume={run_dir}", "processes=2")
    records = assert_exactly_once(ledger)
    assert all(r["interrupted"] for r in records if r["kind"] == "attempt_failed")


class KillsItsProcess:
    """An agent (``agent=python``) whose episodes of task ``beta`` SIGKILL the process playing them."""

    name = "kills-its-process"
    whole_task_steps = False

    def start(self, episode: EpisodeContext) -> _SolveThenSubmit:
        if episode.task.id == "beta" and episode.seed == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        return _SolveThenSubmit()


class _SolveThenSubmit:
    def __init__(self, *, slow: bool = False) -> None:
        self.actions = iter(["sleep 0.3", SOLVE] if slow else [SOLVE])

    def act(self, observation: Observation, info: dict[str, Any]) -> str:
        return next(self.actions, SUBMIT)


def test_an_episode_that_kills_every_worker_ends_as_infra_error_and_the_rest_are_scored(
    tmp_path: Path, store_dir: Path, suite_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    plan = ["agent=python", f"agent.target={__name__}:KillsItsProcess", "suite=dir", f"suite.path={suite_dir}",
            "episodes_per_task=2", "pool.size=2", "processes=2", "max_attempts=2", "benchmark.plots=false"]  # fmt: skip
    done = subprocess.run(runner(tmp_path, store_dir, *plan, f"output_dir={run_dir}"), cwd=REPO,
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 4, done.stderr[-3000:]  # incomplete: one episode unscored
    records = list(read_records(run_dir / LEDGER_FILE))
    assert_every_attempt_closed_once(records)
    results = results_by_episode(records)
    assert len(results) == 2 * len(TASK_IDS)
    poisoned = results.pop("beta:0")
    assert poisoned["outcome"] == "infra_error" and "was killed by SIGKILL" in poisoned["error"]
    assert poisoned["attempt"] == 2 and poisoned["infra_failures"] == 2
    assert {r["outcome"] for r in results.values()} == {"scored"}


class RefusedOnGamma:
    """An agent (``agent=python``) whose model refuses the episodes of task ``gamma`` (a bad key, say), after
    the others have played a while: the run must stop in every worker."""

    name = "refused-on-gamma"
    whole_task_steps = False

    def start(self, episode: EpisodeContext) -> _SolveThenSubmit:
        if episode.task.id == "gamma" and episode.seed == 3:
            raise ModelRequestError("HTTP 401: invalid API key")
        return _SolveThenSubmit(slow=True)


def test_what_stops_one_worker_stops_them_all(tmp_path: Path, store_dir: Path, suite_dir: Path) -> None:
    run_dir = tmp_path / "run"
    ledger = run_dir / LEDGER_FILE
    plan = ["agent=python", f"agent.target={__name__}:RefusedOnGamma", "suite=dir", f"suite.path={suite_dir}",
            "episodes_per_task=6", "pool.size=2", "processes=2", "benchmark.plots=false"]  # fmt: skip
    done = subprocess.run(runner(tmp_path, store_dir, *plan, f"output_dir={run_dir}"), cwd=REPO,
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert "HTTP 401: invalid API key" in done.stderr
    stopped = ledger_state(ledger)
    assert not stopped.unfinished  # the other worker's episode in flight was closed, not left open
    assert len(stopped.results) < 3 * 6  # the episodes after the refusal were not played
    assert list((tmp_path / "runtime").iterdir()) == []


def test_processes_beyond_the_pool_size_are_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match=r"processes=3 \(at most pool.size=2"):
        EvalSettings(concurrency=2, processes=3)
    with pytest.raises(ConfigError, match=r"processes=0 \(at least 1\)"):
        EvalSettings(processes=0)
