"""Ctrl-C is a clean, resumable stop, as a user meets it at a terminal (issue 32, item 3).

``python -m benchmarks.run`` runs in its own process group on the local backend with the replay agent,
whose steps take a while; SIGINT goes to the whole group, as a terminal's Ctrl-C does. The first one
cuts the episode in flight at its next step (after that step's checkpoint), writes summary.json with the
state ``interrupted``, prints the run directory and the resume command, and exits 130; the printed
command finishes the run without playing the finished episodes again. A second Ctrl-C stops at once,
still with 130, and leaves no process of the run behind.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.episodes.recording.ledger import LEDGER_FILE, read_records
from tests.runner.test_runner_ledger import descendants, ledger_state, still_running
from tests.support.fixtures.runner_fixtures import REPO, SOLVE, TASK

pytest_plugins = ["tests.support.fixtures.runner_fixtures"]

RESUME_PREFIX = "snapgym: resume with: "


def write_actions(path: Path, pause: str, steps: int) -> Path:
    actions = [f"{pause}; echo step {i}" for i in range(steps)] + [SOLVE]
    path.write_text("".join(json.dumps({"action": action}) + "\n" for action in actions))
    return path


def start(tmp: Path, store: Path, actions: Path) -> tuple[subprocess.Popen[str], Path, Path]:
    """The runner on three episodes of TASK, one at a time, checkpointing every 2 steps; its stderr file."""
    run_dir, err = tmp / "run", tmp / "stderr.txt"
    command = [
        sys.executable, "-m", "benchmarks.run", f"suite.include=[{TASK}]", f"backend.store_dir={store}",
        f"output_dir={run_dir}", f"hydra.run.dir={tmp / 'hydra'}", "progress=false", "benchmark.plots=false",
        "agent=replay", f"agent.path={actions}", "checkpoint_every=2", "episodes_per_task=3", "pool.size=1",
    ]  # fmt: skip
    with err.open("w") as stderr:
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr, text=True,
                                start_new_session=True)  # fmt: skip
    return proc, run_dir, err


def wait_for(proc: subprocess.Popen[str], err: Path, ready: object, what: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():  # type: ignore[operator]
        assert proc.poll() is None, f"the runner ended before {what}: {err.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{what} never happened: {err.read_text()[-3000:]}"
        time.sleep(0.05)


def ctrl_c(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGINT)


def stop_for_good(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_ctrl_c_writes_an_interrupted_summary_prints_the_resume_command_and_the_resume_finishes(
    tmp_path: Path, runner_store: Path
) -> None:
    actions = write_actions(tmp_path / "actions.jsonl", "sleep 0.5", 6)
    proc, run_dir, err = start(tmp_path, runner_store, actions)
    ledger = run_dir / LEDGER_FILE
    try:
        journal = run_dir / "episodes" / TASK / "1-journal.jsonl"
        wait_for(proc, err, lambda: journal.exists() and '"checkpoint"' in journal.read_text(),
                 "the second episode's first checkpoint")  # fmt: skip
        assert len(ledger_state(ledger).results) == 1
        ctrl_c(proc)
        assert proc.wait(timeout=60) == 130, err.read_text()[-3000:]
    finally:
        stop_for_good(proc)
    lines = err.read_text().splitlines()
    assert f"snapgym: run directory: {run_dir}" in lines
    assert any(line.startswith("snapgym: run interrupted: ") and "1 of 3 episodes have a final result" in line
               for line in lines), lines  # fmt: skip
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state"] == "interrupted"
    assert (summary["counts"]["scheduled"], summary["counts"]["finished"]) == (3, 1)
    records = list(read_records(ledger))
    cut = [r for r in records if r["kind"] == "attempt_failed"]
    assert len(cut) == 1 and cut[0]["interrupted"] and cut[0]["episode_id"] == f"{TASK}:1"
    first = {r["episode_id"]: r for r in records if r["kind"] == "result"}
    assert set(first) == {f"{TASK}:0"}

    (command,) = [line.removeprefix(RESUME_PREFIX) for line in lines if line.startswith(RESUME_PREFIX)]
    argv = shlex.split(command)
    assert argv[1:4] == ["-m", "benchmarks.run", f"resume={run_dir}"]
    resumed = subprocess.run([sys.executable, *argv[1:], f"hydra.run.dir={tmp_path / 'hydra-resume'}"],
                             cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = list(read_records(ledger))
    results = {r["episode_id"]: r for r in records if r["kind"] == "result"}
    assert len(results) == len([r for r in records if r["kind"] == "result"]) == 3
    assert results[f"{TASK}:0"] == first[f"{TASK}:0"]  # the finished episode was not played again
    assert results[f"{TASK}:1"]["attempt"] == 2 and results[f"{TASK}:1"]["resumed_from_step"] >= 2
    assert {r["outcome"] for r in results.values()} == {"scored"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "state" not in summary and "stopped" not in summary
    assert (summary["counts"]["finished"], summary["counts"]["interrupted_attempts"]) == (3, 1)


def test_a_second_ctrl_c_stops_at_once_and_leaves_nothing_running(tmp_path: Path, runner_store: Path) -> None:
    actions = write_actions(tmp_path / "actions.jsonl", "sleep 60", 2)
    proc, run_dir, err = start(tmp_path, runner_store, actions)
    journal = run_dir / "episodes" / TASK / "0-journal.jsonl"
    try:
        wait_for(proc, err, lambda: journal.exists() and '"start"' in journal.read_text(), "the episode started")
        in_flight = lambda: any("sleep 60" in args for _, args in descendants(proc.pid).values())  # noqa: E731
        wait_for(proc, err, in_flight, "the 60 s step in flight", 30)  # else the first Ctrl-C has nothing to wait for
        started = descendants(proc.pid)
        ctrl_c(proc)
        wait_for(proc, err, lambda: "Ctrl-C again" in err.read_text(), "the clean stop was announced", 30)
        stopped_at = time.monotonic()
        ctrl_c(proc)
        assert proc.wait(timeout=30) == 130, err.read_text()[-3000:]
        assert time.monotonic() - stopped_at < 30  # not the 60 s the step in flight would take
    finally:
        stop_for_good(proc)
    text = err.read_text()
    # The terminal's SIGINT does not reach the sandbox's daemon (a session of its own): the 60 s step is
    # still in flight at the second Ctrl-C, which stops the run at once.
    assert "interrupted twice: stopped at once; the ledger holds what finished" in text, text[-3000:]
    assert f"snapgym: run directory: {run_dir}" in text and RESUME_PREFIX in text
    assert "Traceback" not in text
    deadline = time.monotonic() + 15  # the sandbox daemon notices its parent is gone
    while (alive := still_running(started)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive == {}, f"processes of the interrupted run are still running: {alive}"
