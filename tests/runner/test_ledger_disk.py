"""The ledger never tears: a full output filesystem stops the run with whole records and a clear error.

The full disk is real: a small tmpfs mounted over the output directory (the tests need root to mount it,
and skip without), filled by the ledger itself. A tmpfs writes short at its last free page and then
refuses with ENOSPC, as a nearly full disk does. The runner runs as a user runs it, and is resumed once
there is room again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.episodes.recording.ledger import LEDGER_FILE, Ledger, LedgerCorruptError, LedgerWriteError, read_records
from tests.support.needs import skip_missing

REPO = Path(__file__).resolve().parents[2]
TRIVIAL = REPO / "benchmarks" / "tasks" / "trivial"
EPISODES_PER_TASK = 6
TASK_IDS = ("alpha", "beta", "gamma")


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` for the block (unmounted after, even on failure)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "snapgym-test-full-disk", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        skip_missing(f"cannot mount a tmpfs for a real full disk: {done.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def resize(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True, capture_output=True)


def whole_records(path: Path) -> list[dict[str, object]]:
    """Every line of the file, each a whole JSON record (fails on a torn or glued one)."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), f"a torn last line: {data[-80:]!r}"
    return [json.loads(line) for line in data.splitlines()]


def record(i: int) -> dict[str, object]:
    """A record of exactly 1000 bytes as a line."""
    base = {"kind": "attempt", "episode_id": f"e:{i:04d}", "attempt": 1, "attempt_id": f"e:{i:04d}/1", "pad": ""}
    pad = 1000 - len(json.dumps(base)) - 1
    return {**base, "pad": "x" * pad}


def test_a_full_disk_cuts_the_ledger_back_to_whole_records_and_stops_it(tmp_path: Path) -> None:
    """16 KiB hold 16 records of 1000 bytes; the 17th is written short (384 bytes), the rest is refused."""
    with tmpfs(tmp_path / "out", "16k") as out:
        ledger = Ledger.open(out / "run")
        try:
            written = 0
            with pytest.raises(LedgerWriteError) as refused:
                while True:
                    ledger.append(record(written))
                    written += 1
            message = str(refused.value)
            assert str(out / "run" / LEDGER_FILE) in message and "No space left on device" in message
            assert "resume=true output_dir=" in message and "Free space" in message
            short, size = map(int, re.search(r"\((\d+) of (\d+) bytes", message).groups())  # type: ignore[union-attr]
            assert 0 < short < size == 1000  # a short write happened, and was not left in the file
            assert written == 16
            assert [r["episode_id"] for r in whole_records(out / "run" / LEDGER_FILE)] == [
                f"e:{i:04d}" for i in range(16)
            ]
            with pytest.raises(LedgerWriteError):  # the ledger stays refused: the run stops
                ledger.append(record(99))
            assert len(whole_records(out / "run" / LEDGER_FILE)) == 16
        finally:
            ledger.close()
        resize(out, "64k")  # room again: the same ledger resumes where it stopped
        with Ledger.open(out / "run") as reopened:
            assert reopened.torn_bytes == 0 and len(reopened.state.unfinished) == 16
            reopened.append(record(16))
        assert len(whole_records(out / "run" / LEDGER_FILE)) == 17


def runner(tmp_path: Path, store: Path, run_dir: Path, suite: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "agent=replay", 'agent.actions=["echo ok > /app/answer.txt"]',
         "suite=dir", f"suite.path={suite}", f"episodes_per_task={EPISODES_PER_TASK}", "pool.size=2",
         "benchmark.plots=false", "progress=false", f"backend.store_dir={store}", f"output_dir={run_dir}",
         f"hydra.run.dir={tmp_path / 'hydra'}", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.timeout(180)
def test_a_run_whose_output_disk_fills_stops_with_a_clear_error_and_resumes_once_there_is_room(
    tmp_path: Path, store_dir: Path
) -> None:
    suite = tmp_path / "suite"
    for task_id in TASK_IDS:
        shutil.copytree(TRIVIAL, suite / task_id)
    planned = {f"{task}:{i}" for task in TASK_IDS for i in range(EPISODES_PER_TASK)}
    with tmpfs(tmp_path / "out", "12k") as out:  # run.yaml, then room for about 7 of the 18 episodes
        run_dir = out / "run"
        stopped = runner(tmp_path, store_dir, run_dir, suite)
        assert stopped.returncode == 3, stopped.stderr[-3000:]
        reason = stopped.stderr.strip().splitlines()[-1]
        assert reason.startswith(f"snapgym: run stopped: LedgerWriteError: writing the ledger {run_dir / LEDGER_FILE}")
        assert "No space left on device" in reason and f"resume=true output_dir={run_dir}" in reason
        records = whole_records(run_dir / LEDGER_FILE)
        results = [r for r in records if r["kind"] == "result"]
        assert 0 < len(results) < len(planned)
        assert not list(run_dir.glob(".*.tmp")), "no half-written report is left behind"
        if (run_dir / "summary.json").exists():  # whole, or not at all
            assert "LedgerWriteError" in json.loads((run_dir / "summary.json").read_text())["stopped"]
        else:
            assert "summary.json could not be written either" in reason

        resize(out, "1m")
        resumed = runner(tmp_path, store_dir, run_dir, suite, "resume=true")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        records = whole_records(run_dir / LEDGER_FILE)
        counts = Counter(r["episode_id"] for r in records if r["kind"] == "result")
        assert set(counts) == planned and set(counts.values()) == {1}
        assert {r["outcome"] for r in records if r["kind"] == "result"} == {"scored"}
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["counts"]["finished"] == summary["counts"]["scored"] == len(planned)


def test_a_torn_last_line_is_cut_with_a_warning_naming_its_size(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Ledger.open(tmp_path) as ledger:
        ledger.append(record(0))
    torn = b'{"kind": "result", "episode_id": "e:0000", "att'
    with (tmp_path / LEDGER_FILE).open("ab") as file:
        file.write(torn)
    with (
        caplog.at_level(logging.WARNING, logger="benchmarks.episodes.recording.ledger"),
        Ledger.open(tmp_path) as reopened,
    ):
        assert reopened.torn_bytes == len(torn)
        assert reopened.state.unfinished == {"e:0000": 1}
    assert f"torn last line of {len(torn)} bytes" in caplog.text
    assert len(whole_records(tmp_path / LEDGER_FILE)) == 1


def test_a_damaged_line_before_the_last_is_a_clear_error_not_a_json_traceback(tmp_path: Path) -> None:
    lines = [json.dumps(record(i)).encode() + b"\n" for i in range(3)]
    (tmp_path / LEDGER_FILE).write_bytes(lines[0] + lines[1][:500] + lines[2])  # a record glued to a torn one
    with pytest.raises(LedgerCorruptError, match=r"line 2 \(byte 1000\) is not a whole record"):
        Ledger.open(tmp_path)
    with pytest.raises(LedgerCorruptError):
        list(read_records(tmp_path / LEDGER_FILE))
