"""The no-isolation baseline of the throughput scenario: the same episodes as plain subprocesses.

What it would cost to run an episode's commands at all: a scratch folder stands
for the task's ``/app`` (made and removed per episode), the actions run one after
another in one ``bash`` per episode started there (as Shell-v0 steps run in the
episode's shell on the local backend), each step a line written to it and read
back up to a marker with its exit code, the task's
``tests/test.sh`` runs as ``bash test.sh`` (as the verifier runs it, and Harbor) with its ``/app``
and ``/logs`` paths pointed at the scratch folder, both shells in the environment a sandbox's
commands start from (:data:`pool.snapshots.BASE_ENV`: its ``LANG`` alone decides which locale
files bash loads), and a JSON line per episode is appended to a ledger and fsync-ed, as the
runner's ledger is. No namespaces, no snapshot, no
verifier boundary: nothing an agent could not escape, so this is a floor, never
a way to run episodes.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from pool.errors import SnapgymError
from pool.snapshots import BASE_ENV

SANDBOX_COMMAND_ENV = {**BASE_ENV, "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
"""A sandbox's commands' environment (its snapshot's PATH), so both run the same programs the same way."""


class BaselineFailedError(SnapgymError):
    """A baseline episode did not score 1: the baseline would not be doing the same work, so its
    figure means nothing (the message has the verifier's output)."""


def episodes_per_s(
    task_dir: Path, actions: list[str], *, episodes: int, concurrency: int, scratch: Path, timeout_s: float = 30.0
) -> float:
    """Play ``episodes`` baseline episodes ``concurrency`` at a time; complete episodes per second.

    Raises:
        BaselineFailedError: an episode's verifier did not give reward 1 (the baseline must do the same work).
    """
    test_script = (task_dir / "tests" / "test.sh").read_text()
    ledger = scratch / "baseline-ledger.jsonl"
    lock = threading.Lock()
    with open(ledger, "a", encoding="utf-8") as out:

        def one(index: int) -> None:
            reward, output = _episode(test_script, actions, scratch, timeout_s)
            if reward != "1":
                raise BaselineFailedError(
                    f"the no-isolation baseline's episode {index} scored {reward!r}, not 1, so the throughput "
                    f"comparison cannot be made; its verifier's output (end): {output[-1500:]!r}"
                )
            with lock:
                out.write(json.dumps({"episode": index, "reward": 1.0, "at": time.time()}) + "\n")
                out.flush()
                os.fsync(out.fileno())

        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(concurrency) as workers:
            for future in [workers.submit(one, i) for i in range(episodes)]:
                future.result()
        return episodes / (time.perf_counter() - started)


def _episode(test_script: str, actions: list[str], scratch: Path, timeout_s: float) -> tuple[str | None, str]:
    """One episode in a fresh scratch folder: the reward file's text (None: none was written) and the
    verifier's output."""
    root = Path(tempfile.mkdtemp(dir=scratch))
    try:
        app, logs = root / "app", root / "logs" / "verifier"
        app.mkdir()
        logs.mkdir(parents=True)
        _play_in_one_shell([action.replace("/app", str(app)) for action in actions], app)
        test = root / "test.sh"
        test.write_text(test_script.replace("/app", str(app)).replace("/logs/verifier", str(logs)))
        try:
            done = subprocess.run(["bash", str(test)], cwd=app, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=timeout_s, check=False, env=SANDBOX_COMMAND_ENV)  # fmt: skip
            output = done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            output = f"[the verifier ran past {timeout_s:g} s]"
        reward = logs / "reward.txt"
        return (reward.read_text().strip() if reward.is_file() else None), output
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _play_in_one_shell(actions: list[str], cwd: Path) -> None:
    """Each action typed into one bash, waiting for its exit code before the next (a step's round trip)."""
    shell = subprocess.Popen(["bash", "--noprofile", "--norc"], cwd=cwd, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=SANDBOX_COMMAND_ENV)  # fmt: skip
    assert shell.stdin is not None and shell.stdout is not None
    try:
        for action in actions:
            shell.stdin.write(f"{action} </dev/null\necho __snapgym_done_$?\n".encode())
            shell.stdin.flush()
            while not (line := shell.stdout.readline()).startswith(b"__snapgym_done_"):
                if not line:
                    raise AssertionError(f"the baseline's bash ended during {action!r}")
    finally:
        shell.stdin.close()
        shell.wait()
