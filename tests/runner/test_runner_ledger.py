"""Nothing is lost: every scheduled episode ends exactly once in the ledger, through kills, tears and failures.

The runner, the local backend, the sandboxes and the tasks are real. The
resume tests run ``python -m benchmarks.run`` as a user does and SIGKILL it;
the others drive :class:`benchmarks.episodes.evaluation.Evaluation` from here with a
scripted agent (a test double of the agent only) that breaks things the way
real agents and real machines do.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from benchmarks.agents.base import AgentError, EpisodeContext, Observation
from benchmarks.episodes.evaluation import EvalSettings, Evaluation
from benchmarks.episodes.recording.ledger import LEDGER_FILE, Ledger, LedgerState, read_records
from benchmarks.episodes.sources.supply import BackendSupply
from benchmarks.reports.results import format_summary, read_run, summarize_run
from envs import SUBMIT
from envs.tasks import Task, load_tasks
from pool import Backend, ConfigError, LocalBackend
from tests.envs.test_envs_infra import kill_init_from_the_host

REPO = Path(__file__).resolve().parents[2]
TRIVIAL = REPO / "benchmarks" / "tasks" / "trivial"
TASK_IDS = ("alpha", "beta", "gamma")
"""Copies of the trivial task (write ``ok`` to /app/answer.txt)."""
SOLVE = "echo ok > /app/answer.txt"
CLI_EPISODES_PER_TASK = 12
CLI_PLAN = [
    "agent=replay",
    f'agent.actions=[sleep 0.3,"{SOLVE}"]',
    "suite=dir",
    f"episodes_per_task={CLI_EPISODES_PER_TASK}",
    "pool.size=2",
    "benchmark.plots=false",
]
"""36 episodes of ~0.35 s, two at a time: a run that is still going when it is killed."""
RAN_TWICE = [("attempt", 1), ("attempt_failed", 1), ("attempt", 2), ("result", 2)]
"""An episode's records when its first attempt failed or was cut short and its second ended it."""


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("suite")
    for task_id in TASK_IDS:
        shutil.copytree(TRIVIAL, root / task_id)
    return root


@pytest.fixture(scope="module")
def tasks(suite_dir: Path) -> list[Task]:
    return load_tasks(suite_dir)


# -- a scripted agent (the only double here) -------------------------------------

Step = str | Callable[[EpisodeContext], str]
"""An action, or a function of the episode that returns one (and may break something first)."""


class ScriptedAgent:
    """Plays a script per task and attempt: ``scripts[task_id][n]`` on the n-th start of an episode.

    The last script repeats for later attempts. After a script, the policy submits.
    Every observation a policy sees is kept in ``observations[(task_id, seed)]``.
    """

    name = "scripted"
    whole_task_steps = False

    def __init__(self, scripts: Mapping[str, Sequence[Sequence[Step]]]) -> None:
        self.scripts = scripts
        self.observations: dict[tuple[str, int], list[str]] = {}
        self._starts: Counter[tuple[str, int]] = Counter()
        self._lock = threading.Lock()

    def start(self, episode: EpisodeContext) -> _ScriptedPolicy:
        if episode.task.id not in self.scripts:
            raise AgentError(f"no script for task {episode.task.id}")
        key = (episode.task.id, episode.seed)
        with self._lock:
            self._starts[key] += 1
            attempt = self._starts[key]
            seen = self.observations.setdefault(key, [])
        scripts = self.scripts[episode.task.id]
        return _ScriptedPolicy(episode, scripts[min(attempt, len(scripts)) - 1], seen)


class _ScriptedPolicy:
    def __init__(self, episode: EpisodeContext, script: Sequence[Step], seen: list[str]) -> None:
        self._episode = episode
        self._steps = iter(script)
        self._seen = seen

    def act(self, observation: Observation, info: dict[str, Any]) -> str:
        self._seen.append(str(observation["output"]))
        step = next(self._steps, SUBMIT)
        return step(self._episode) if callable(step) else step


def close_the_sandbox(episode: EpisodeContext) -> str:
    """Close the episode's real sandbox behind the environment's back, then act."""
    sandbox = episode.env.unwrapped.sandbox  # type: ignore[attr-defined]
    sandbox.close()
    return SOLVE


def kill_the_sandbox(episode: EpisodeContext) -> str:
    """SIGKILL the sandbox's init from the host, then act."""
    kill_init_from_the_host(episode.env.unwrapped)  # type: ignore[arg-type]
    return SOLVE


def crash(episode: EpisodeContext) -> str:
    raise RuntimeError("the agent has a bug")


def slowly(action: str, seconds: float) -> Step:
    """An agent that deliberates for ``seconds`` before answering ``action``."""

    def step(episode: EpisodeContext) -> str:
        time.sleep(seconds)
        return action

    return step


# -- running the real runner in this process --------------------------------------


def evaluate(
    run_dir: Path, tasks: Sequence[Task], agent: Any, backend: LocalBackend | Callable[[], Backend], **settings: Any
) -> list[dict[str, Any]]:
    """Run (or resume) an evaluation into ``run_dir`` on a real backend; returns the ledger's records.

    ``backend`` is the backend, or what opens one (again when its daemon dies).
    """
    open_backend = backend if callable(backend) else lambda: backend
    supply = BackendSupply(open_backend)
    with Ledger.open(run_dir) as ledger:
        Evaluation(tasks, agent, supply, ledger, EvalSettings(**settings)).run()
    return list(read_records(run_dir / LEDGER_FILE))


def summary_of(run_dir: Path, scheduled: int) -> dict[str, Any]:
    frame, failed = read_run(run_dir)
    return summarize_run(run_dir, frame, failed, scheduled=scheduled, ks=[1], meta={})


def results_by_episode(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """episode_id -> its result, asserting there is exactly one per episode."""
    results = [r for r in records if r["kind"] == "result"]
    counts = Counter(r["episode_id"] for r in results)
    assert all(n == 1 for n in counts.values()), f"episodes with several results: {counts}"
    return {r["episode_id"]: r for r in results}


def history(records: Sequence[dict[str, Any]], episode_id: str) -> list[tuple[str, int]]:
    """(kind, attempt) of every record of one episode, in order."""
    return [(r["kind"], r["attempt"]) for r in records if r["episode_id"] == episode_id]


def assert_every_attempt_closed_once(records: Sequence[dict[str, Any]]) -> None:
    """Attempt ids are unique, and each attempt ends in exactly one attempt_failed or result."""
    started = [r["attempt_id"] for r in records if r["kind"] == "attempt"]
    ended = [r["attempt_id"] for r in records if r["kind"] in ("attempt_failed", "result")]
    assert len(started) == len(set(started)), Counter(started).most_common(3)
    assert sorted(started) == sorted(ended)


# -- 1. resume after SIGKILL, as a user does ---------------------------------------


def runner(tmp: Path, store: Path, *overrides: str) -> list[str]:
    return [
        sys.executable, "-m", "benchmarks.run", *overrides,
        f"backend.store_dir={store}", f"backend.runtime_dir={tmp / 'runtime'}",
        "progress=false", f"hydra.run.dir={tmp / 'hydra'}",
    ]  # fmt: skip


def run_to_the_end(tmp: Path, store: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(runner(tmp, store, *overrides), cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def ledger_state(path: Path) -> LedgerState:
    state = LedgerState()
    if path.exists():
        for record in read_records(path):
            state.observe(record)
    return state


def start_and_kill(tmp: Path, store: Path, ledger: Path, *overrides: str, results_before_kill: int) -> int:
    """Start the runner, SIGKILL its process group once the ledger holds enough results; returns its pid.

    Also checks that every process the run had started (its sandbox daemon and
    the sandboxes' processes) goes away with it.
    """
    with (tmp / f"runner-{time.monotonic_ns()}.log").open("w") as log:
        proc = subprocess.Popen(
            runner(tmp, store, *overrides), cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"the runner ended before it was killed: {log.name}"
            assert time.monotonic() < deadline, "the runner recorded too few results"
            state = ledger_state(ledger)
            if len(state.results) >= results_before_kill and state.unfinished:
                break
            time.sleep(0.02)
        started = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert any("sandboxd" in args for _, args in started.values()), started
    deadline = time.monotonic() + 15  # the daemon notices its parent is gone; not a timing assertion
    while (alive := still_running(started)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive == {}, f"processes of the killed run are still running: {alive}"
    return proc.pid


def still_running(processes: Mapping[int, tuple[str, str]]) -> dict[int, tuple[str, str]]:
    """Those of ``processes`` that still run (the same pid and start time)."""
    return {pid: info for pid, info in processes.items() if process(pid) == info}


def process(pid: int) -> tuple[str, str] | None:
    """(start time, command line) of a live process, or None (zombies count as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return None if stat[0] == "Z" else (stat[19], args)


def descendants(root: int) -> dict[int, tuple[str, str]]:
    """Every live process below ``root``: pid -> (start time, command line)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1])
            except OSError:
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found: dict[int, tuple[str, str]] = {}
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            if (info := process(child)) is not None:
                found[child] = info
            todo.append(child)
    return found


def whole_lines(path: Path) -> bytes:
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1]


def test_a_killed_run_resumes_to_exactly_one_result_per_episode(
    tmp_path: Path, store_dir: Path, suite_dir: Path
) -> None:
    """Kill, resume=<dir> and kill again, resume=true: every episode ends once; nothing is left running."""
    run_dir, runtime = tmp_path / "run", tmp_path / "runtime"
    ledger = run_dir / LEDGER_FILE
    planned = {f"{task}:{i}" for task in TASK_IDS for i in range(CLI_EPISODES_PER_TASK)}
    plan = [*CLI_PLAN, f"suite.path={suite_dir}"]

    first = start_and_kill(tmp_path, store_dir, ledger, *plan, f"output_dir={run_dir}", results_before_kill=4)
    after_first = ledger_state(ledger)
    assert 4 <= len(after_first.results) < len(planned)
    assert after_first.unfinished, "the kill found no attempt in flight"
    leftovers = [p.name for p in runtime.iterdir()]  # left behind until the next backend reaps them
    assert leftovers and all(name.startswith(f"{first}-") for name in leftovers)
    with ledger.open("ab") as file:  # a kill can land mid-write: half a record, no newline
        file.write(b'{"kind": "result", "run_id": "x", "episode_id": "alp')
    kept = whole_lines(ledger)

    second = start_and_kill(
        tmp_path, store_dir, ledger, f"resume={run_dir}", results_before_kill=len(after_first.results) + 4
    )
    assert ledger.read_bytes().startswith(kept)  # the torn line was cut; nothing before it changed
    after_second = ledger_state(ledger)
    assert after_second.unfinished
    assert not any(p.name.startswith(f"{first}-") for p in runtime.iterdir())  # reaped by the second run
    kept = whole_lines(ledger)

    done = run_to_the_end(tmp_path, store_dir, "resume=true", f"output_dir={run_dir}")
    assert f"episodes {len(planned)}/{len(planned)}" in done.stdout
    assert ledger.read_bytes().startswith(kept)
    assert list(runtime.iterdir()) == []  # the second run's leftovers reaped, the third's closed

    records = list(read_records(ledger))
    results = results_by_episode(records)
    assert set(results) == planned
    assert {r["outcome"] for r in results.values()} == {"scored"}
    assert len({r["run_id"] for r in results.values()}) == 3  # each session kept what the one before it did
    assert_every_attempt_closed_once(records)
    interrupted = {(r["episode_id"], r["attempt"]) for r in records if r["kind"] == "attempt_failed"}
    assert all(r["interrupted"] for r in records if r["kind"] == "attempt_failed")
    assert interrupted == set(after_first.unfinished.items()) | set(after_second.unfinished.items())
    for episode_id, attempt in interrupted:
        assert results[episode_id]["attempt"] > attempt
        assert results[episode_id]["infra_failures"] == 0  # a kill is not the episode's infrastructure failing

    frame = pd.read_parquet(run_dir / "episodes.parquet")
    assert len(frame) == len(planned) and set(frame["episode_id"]) == planned
    summary = json.loads((run_dir / "summary.json").read_text())
    counts = summary["counts"]
    assert counts["scheduled"] == counts["finished"] == counts["scored"] == len(planned)
    assert (counts["interrupted_attempts"], counts["retried_attempts"]) == (len(interrupted), 0)
    assert summary["mean_reward"] == 1.0
    assert f"(attempts played again: {len(interrupted)} after an interruption)" in format_summary(summary)
    assert not any(str(runtime / f"{pid}-") in args for pid in (first, second) for _, args in descendants(1).values())

    finished = ledger.read_bytes()
    again = run_to_the_end(tmp_path, store_dir, f"resume={run_dir}")
    assert f"episodes {len(planned)}/{len(planned)}" in again.stdout
    assert ledger.read_bytes() == finished  # resuming a finished run plays nothing


# -- 2, 3. the ledger file ---------------------------------------------------------


def test_a_torn_last_line_is_cut_and_its_episode_runs_again(
    tmp_path: Path, tasks: list[Task], backend: LocalBackend
) -> None:
    run_dir = tmp_path / "run"
    agent = ScriptedAgent({task.id: [[SOLVE]] for task in tasks})
    evaluate(run_dir, tasks[:2], agent, backend, episodes_per_task=1)
    ledger = run_dir / LEDGER_FILE
    lines = ledger.read_bytes().splitlines(keepends=True)
    last = json.loads(lines[-1])
    assert last["kind"] == "result"
    ledger.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # killed mid-write

    with Ledger.open(run_dir) as reopened:
        assert ledger.read_bytes() == b"".join(lines[:-1])
        assert last["episode_id"] not in reopened.state.results
        assert reopened.state.unfinished == {last["episode_id"]: 1}

    records = evaluate(run_dir, tasks[:2], agent, backend, episodes_per_task=1)
    results = results_by_episode(records)
    assert set(results) == {f"{task.id}:0" for task in tasks[:2]}
    assert history(records, last["episode_id"]) == RAN_TWICE
    assert [r["interrupted"] for r in records if r["kind"] == "attempt_failed"] == [True]
    assert results[last["episode_id"]]["outcome"] == "scored"
    assert_every_attempt_closed_once(records)


def test_the_ledger_refuses_a_second_result_for_an_episode(tmp_path: Path) -> None:
    result = {"kind": "result", "episode_id": "alpha:0", "attempt": 1, "attempt_id": "alpha:0/1", "reward": 1.0}
    with Ledger.open(tmp_path) as ledger:
        ledger.append({"kind": "attempt", "episode_id": "alpha:0", "attempt": 1, "attempt_id": "alpha:0/1"})
        ledger.append(result)
        written = (tmp_path / LEDGER_FILE).read_bytes()
        with pytest.raises(ConfigError, match="already has a result"):
            ledger.append({**result, "reward": 0.0})
    # the refusal holds across a resume, from what is on disk
    with Ledger.open(tmp_path) as reopened, pytest.raises(ConfigError, match="already has a result"):
        reopened.append({**result, "attempt": 2, "attempt_id": "alpha:0/2"})
    assert (tmp_path / LEDGER_FILE).read_bytes() == written


def test_a_resume_plays_infra_errors_again_and_keeps_every_other_result(
    tmp_path: Path, tasks: list[Task], backend: LocalBackend
) -> None:
    """alpha's infrastructure always fails (final infra_error), beta's agent crashes, gamma scores. A resume
    supersedes alpha's result and plays it again under new attempt ids with a fresh max_attempts; beta's
    agent_error and gamma's score are final. Each episode counts once, by its standing result."""
    broken = ScriptedAgent({"alpha": [[close_the_sandbox]], "beta": [[crash]], "gamma": [[SOLVE]]})
    first = evaluate(tmp_path, tasks, broken, backend, episodes_per_task=1, max_attempts=2)
    assert results_by_episode(first)["alpha:0"]["outcome"] == "infra_error"
    written = (tmp_path / LEDGER_FILE).read_bytes()

    fixed = ScriptedAgent({"alpha": [[SOLVE]], "beta": [[SOLVE]], "gamma": [[SOLVE]]})
    records = evaluate(tmp_path, tasks, fixed, backend, episodes_per_task=1, max_attempts=2)
    assert (tmp_path / LEDGER_FILE).read_bytes().startswith(written)  # append-only: history kept
    new = records[len(first) :]
    assert [(r["kind"], r["episode_id"], r["attempt"]) for r in new] == [
        ("superseded", "alpha:0", 2),
        ("attempt", "alpha:0", 3),
        ("result", "alpha:0", 3),
    ]
    assert new[0]["attempt_id"] == "alpha:0/2"  # the result it replaces
    assert (new[-1]["outcome"], new[-1]["reward"], new[-1]["infra_failures"]) == ("scored", 1.0, 0)
    assert_every_attempt_closed_once(records)

    frame, _ = read_run(tmp_path)
    assert sorted(frame["episode_id"]) == ["alpha:0", "beta:0", "gamma:0"]
    assert dict(zip(frame["episode_id"], frame["outcome"], strict=True)) == {
        "alpha:0": "scored", "beta:0": "agent_error", "gamma:0": "scored"
    }  # fmt: skip
    summary = summary_of(tmp_path, scheduled=3)
    counts = summary["counts"]
    assert (counts["finished"], counts["infra_error"], counts["superseded"], counts["retried_attempts"]) == (3, 0, 1, 1)
    replayed = "(attempts played again: 1 after an infrastructure failure, 1 unscored results a resume played again)"
    assert replayed in format_summary(summary)

    again = evaluate(tmp_path, tasks, fixed, backend, episodes_per_task=1, max_attempts=2)
    assert again == records  # every result is final now: nothing is played


def test_the_ledger_supersedes_only_a_standing_result(tmp_path: Path) -> None:
    result = {"kind": "result", "episode_id": "alpha:0", "attempt": 1, "attempt_id": "alpha:0/1", "outcome": "x"}
    superseded = {"kind": "superseded", "episode_id": "alpha:0", "attempt": 1, "attempt_id": "alpha:0/1"}
    with Ledger.open(tmp_path) as ledger:
        with pytest.raises(ConfigError, match="no standing result"):
            ledger.append(superseded)
        ledger.append({"kind": "attempt", "episode_id": "alpha:0", "attempt": 1, "attempt_id": "alpha:0/1"})
        ledger.append(result)
        ledger.append(superseded)
        assert "alpha:0" not in ledger.state.results
        ledger.append({**result, "attempt": 2, "attempt_id": "alpha:0/2"})  # the next pass may end it again
        with pytest.raises(ConfigError, match="already has a result"):
            ledger.append({**result, "attempt": 3, "attempt_id": "alpha:0/3"})
    with Ledger.open(tmp_path) as reopened:
        assert reopened.state.results["alpha:0"]["attempt"] == 2
        assert (reopened.state.attempts["alpha:0"], reopened.state.superseded) == (2, 1)


# -- 4. infrastructure failures: retried under a new attempt id, never averaged -----


@pytest.mark.parametrize("break_it", [close_the_sandbox, kill_the_sandbox], ids=["closed", "killed"])
def test_a_sandbox_lost_mid_episode_is_retried_and_then_scored(
    tmp_path: Path, tasks: list[Task], backend: LocalBackend, break_it: Step
) -> None:
    agent = ScriptedAgent({"alpha": [[break_it], [SOLVE]]})
    records = evaluate(tmp_path, tasks[:1], agent, backend, episodes_per_task=2, max_attempts=3)
    results = results_by_episode(records)
    for episode_id in ("alpha:0", "alpha:1"):
        assert history(records, episode_id) == RAN_TWICE
        failed = next(r for r in records if r["kind"] == "attempt_failed" and r["episode_id"] == episode_id)
        assert failed["interrupted"] is False and "Sandbox" in failed["error"]
        result = results[episode_id]
        assert (result["outcome"], result["reward"], result["infra_failures"]) == ("scored", 1.0, 1)
        assert result["attempt_id"] == f"{episode_id}/2"
    assert_every_attempt_closed_once(records)
    summary = summary_of(tmp_path, scheduled=2)
    assert summary["mean_reward"] == 1.0  # the failed attempts are not zeros
    assert summary["counts"]["retried_attempts"] == 2 and summary["counts"]["infra_error"] == 0


def test_a_dead_sandbox_daemon_is_replaced_and_the_episode_retried(
    tmp_path: Path, store_dir: Path, tasks: list[Task]
) -> None:
    """The daemon behind every sandbox is SIGKILLed mid-episode: the runner opens a new backend and goes on."""
    runtime = tmp_path / "runtime"
    opened: list[LocalBackend] = []

    def open_backend() -> LocalBackend:
        opened.append(LocalBackend(store_dir=store_dir, runtime_dir=runtime, memory_limit_mb=256, pids_limit=128))
        return opened[-1]

    def kill_the_daemon(episode: EpisodeContext) -> str:
        daemons = [pid for pid, (_, args) in descendants(os.getpid()).items() if str(runtime) in args]
        assert len(daemons) == 1, daemons
        os.kill(daemons[0], signal.SIGKILL)
        return SOLVE

    agent = ScriptedAgent({"alpha": [[kill_the_daemon], [SOLVE]]})
    try:
        records = evaluate(tmp_path / "run", tasks[:1], agent, open_backend, episodes_per_task=1, concurrency=1)
    finally:
        for backend in opened:
            backend.close()
    assert history(records, "alpha:0") == RAN_TWICE
    result = results_by_episode(records)["alpha:0"]
    assert (result["outcome"], result["reward"], result["infra_failures"]) == ("scored", 1.0, 1)
    assert len(opened) == 2
    assert not any(str(runtime) in args for _, args in descendants(os.getpid()).values())


def test_an_episode_whose_infrastructure_always_fails_ends_as_infra_error_outside_the_mean(
    tmp_path: Path, tasks: list[Task], backend: LocalBackend
) -> None:
    agent = ScriptedAgent({"alpha": [[close_the_sandbox]], "beta": [[SOLVE]]})
    records = evaluate(tmp_path / "mixed", tasks[:2], agent, backend, episodes_per_task=2, max_attempts=2)
    results = results_by_episode(records)
    for episode_id in ("alpha:0", "alpha:1"):
        assert history(records, episode_id) == RAN_TWICE
        result = results[episode_id]
        assert (result["outcome"], result["reward"], result["infra_failures"]) == ("infra_error", None, 2)
        assert "Sandbox" in result["error"]
    assert {results[f"beta:{i}"]["reward"] for i in range(2)} == {1.0}
    summary = summary_of(tmp_path / "mixed", scheduled=4)
    assert summary["mean_reward"] == 1.0 and summary["pass_rate"] == 1.0  # not 0.5
    assert (summary["counts"]["infra_error"], summary["counts"]["scored"]) == (2, 2)
    assert summary["by_task"]["alpha"]["mean_reward"] is None

    evaluate(tmp_path / "all", tasks[:1], agent, backend, episodes_per_task=2, max_attempts=2)
    summary = summary_of(tmp_path / "all", scheduled=2)
    assert summary["mean_reward"] is None and summary["pass_rate"] is None
    assert summary["counts"]["infra_error"] == summary["counts"]["finished"] == 2


# -- 5, 6. the agent's failures and the task's ---------------------------------------


def test_an_agent_error_ends_the_episode_once_and_counts_as_zero(
    tmp_path: Path, tasks: list[Task], backend: LocalBackend
) -> None:
    """alpha's policy raises, gamma has no script (start raises), beta solves."""
    agent = ScriptedAgent({"alpha": [["true", crash]], "beta": [[SOLVE]]})
    records = evaluate(tmp_path, tasks, agent, backend, episodes_per_task=2, max_attempts=3)
    results = results_by_episode(records)
    for task, error in (("alpha", "RuntimeError: the agent has a bug"), ("gamma", "AgentError: no script")):
        for i in range(2):
            assert history(records, f"{task}:{i}") == [("attempt", 1), ("result", 1)]  # not retried
            result = results[f"{task}:{i}"]
            assert (result["outcome"], result["reward"], result["infra_failures"]) == ("agent_error", None, 0)
            assert result["error"].startswith(error)
    assert results["alpha:0"]["steps"] == 1
    summary = summary_of(tmp_path, scheduled=6)
    assert summary["mean_reward"] == pytest.approx(1 / 3)  # 2 scored ones, 4 agent errors as zeros
    assert (summary["counts"]["agent_error"], summary["counts"]["scored"]) == (4, 2)


def test_an_episode_past_its_time_budget_ends_as_timeout(
    tmp_path: Path, tasks: list[Task], backend: LocalBackend
) -> None:
    """The budget covers the time the actions take in the sandbox; not retried, counted as 0."""
    agent = ScriptedAgent({"alpha": [["sleep 0.5", SOLVE]]})
    records = evaluate(tmp_path, tasks[:1], agent, backend, episodes_per_task=1, episode_timeout_s=0.2)
    assert history(records, "alpha:0") == [("attempt", 1), ("result", 1)]
    result = results_by_episode(records)["alpha:0"]
    assert (result["outcome"], result["reward"], result["steps"]) == ("timeout", None, 1)
    assert "episode_timeout_s=0.2" in result["error"]
    summary = summary_of(tmp_path, scheduled=1)
    assert summary["mean_reward"] == 0.0 and summary["counts"]["timeout"] == 1


def test_an_agent_that_submits_after_its_time_budget_ends_as_timeout(
    tmp_path: Path, tasks: list[Task], backend: LocalBackend
) -> None:
    """The budget covers the agent's own thinking: an answer that comes too late is not scored."""
    agent = ScriptedAgent({"alpha": [[SOLVE, slowly(SUBMIT, 0.5)]]})
    records = evaluate(tmp_path, tasks[:1], agent, backend, episodes_per_task=1, episode_timeout_s=0.2)
    assert history(records, "alpha:0") == [("attempt", 1), ("result", 1)]
    result = results_by_episode(records)["alpha:0"]
    assert (result["outcome"], result["reward"], result["steps"]) == ("timeout", None, 1)


def test_a_task_whose_snapshot_fails_to_build_ends_as_infra_error_and_the_rest_run(
    tmp_path: Path, tasks: list[Task], backend: LocalBackend
) -> None:
    broken = tmp_path / "suite" / "broken"
    shutil.copytree(TRIVIAL, broken)
    (broken / "environment" / "setup.sh").write_text("#!/bin/sh\necho the mirror is down >&2\nexit 1\n")
    suite = [*load_tasks(tmp_path / "suite"), tasks[0]]
    agent = ScriptedAgent({"alpha": [[SOLVE]], "broken": [[SOLVE]]})
    records = evaluate(tmp_path / "run", suite, agent, backend, episodes_per_task=2)
    results = results_by_episode(records)
    assert set(results) == {"broken:0", "broken:1", "alpha:0", "alpha:1"}
    for i in range(2):
        result = results[f"broken:{i}"]
        assert (result["outcome"], result["reward"], result["steps"]) == ("infra_error", None, 0)
        assert "building the task's snapshot failed: BuildError" in result["error"]
        assert "the mirror is down" in result["error"]
        assert results[f"alpha:{i}"]["outcome"] == "scored"
    assert_every_attempt_closed_once(records)
    summary = summary_of(tmp_path / "run", scheduled=4)
    assert summary["mean_reward"] == 1.0 and summary["counts"]["infra_error"] == 2


# -- 7, 8. refused actions, concurrency ---------------------------------------------------


def test_an_invalid_action_is_refused_as_a_step_and_the_episode_goes_on(
    tmp_path: Path, tasks: list[Task], backend: LocalBackend
) -> None:
    too_large = "echo " + "x" * (64 * 1024)
    agent = ScriptedAgent({"alpha": [["echo a\0b", too_large, SOLVE]]})
    records = evaluate(tmp_path, tasks[:1], agent, backend, episodes_per_task=1)
    result = results_by_episode(records)["alpha:0"]
    assert (result["outcome"], result["reward"], result["steps"]) == ("scored", 1.0, 3)
    assert result["end_reason"] == "submitted"
    seen = agent.observations[("alpha", 0)]
    assert seen[1].startswith("[refused: invalid action:") and "NUL" in seen[1]
    assert seen[2].startswith("[refused: invalid action:") and "max_action_bytes" in seen[2]


def test_concurrent_episodes_each_end_once_under_unique_attempt_ids(
    tmp_path: Path, tasks: list[Task], backend: LocalBackend
) -> None:
    """Four episodes really run at once (they meet at a barrier), and none is lost or doubled."""
    four_at_once = threading.Barrier(4, timeout=60)

    def meet(episode: EpisodeContext) -> str:
        four_at_once.wait()
        return SOLVE

    agent = ScriptedAgent({task.id: [[meet]] for task in tasks})
    records = evaluate(tmp_path, tasks, agent, backend, episodes_per_task=4, concurrency=4)
    results = results_by_episode(records)
    assert set(results) == {f"{task.id}:{i}" for task in tasks for i in range(4)}
    assert {(r["outcome"], r["attempt"]) for r in results.values()} == {("scored", 1)}
    assert_every_attempt_closed_once(records)
    assert len({r["attempt_id"] for r in results.values()}) == 12


def test_throughput_comes_from_the_monotonic_clock_not_the_wall_clock(
    tmp_path: Path, tasks: list[Task], backend: LocalBackend
) -> None:
    """The wall clock steps back an hour mid-run (as an NTP correction can): the ledger's human-readable
    times show it, but the session's span, and so throughput, come from the monotonic clock."""
    agent = ScriptedAgent({task.id: [[SOLVE]] for task in tasks})
    records = evaluate(tmp_path, tasks, agent, backend, episodes_per_task=2, concurrency=2)
    results = [r for r in records if r["kind"] == "result"]
    span = max(r["session_finished_s"] for r in results) - min(r["session_started_s"] for r in results)
    assert all(0 <= r["session_started_s"] <= r["session_finished_s"] for r in results)  # a busy machine may start late
    stepped = [{**r, "finished_at": r["finished_at"] - 3600} if r["kind"] == "result" else r for r in records]
    (tmp_path / LEDGER_FILE).write_text("".join(json.dumps(r) + "\n" for r in stepped))

    throughput = summary_of(tmp_path, scheduled=6)["throughput"]
    assert throughput["wall_s"] == pytest.approx(span)
    assert throughput["episodes_per_s"] == pytest.approx(6 / span)


@pytest.fixture(autouse=True)
def _no_leftover_sandboxes(backend: LocalBackend) -> Iterator[None]:
    """Every test closes the environments (and so the sandboxes) it made on the shared backend."""
    before = set(backend._sandboxes)
    yield
    assert set(backend._sandboxes) <= before
