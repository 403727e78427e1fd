"""A pool actor whose node (parent process) dies exits on its own, instead of lingering with sandboxes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GRANDCHILD = """
import sys, time
from pool.cluster.orphans import exit_when_orphaned
exit_when_orphaned(interval_s=0.1)
print("watching", flush=True)
time.sleep(60)
"""

CHILD = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=sys.stdout)
print(grandchild.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_process_exits_once_its_parent_dies() -> None:
    """Like a Ray worker whose raylet was killed: the watcher notices the new parent and exits."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, GRANDCHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        assert child.stdout.readline().strip() == "watching"
        assert _alive(grandchild)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild), "the orphaned process kept running"
    finally:
        child.kill()
