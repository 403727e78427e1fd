"""A terminal's Ctrl-C reaches the program, not its sandbox daemon.

Ctrl-C sends SIGINT to the terminal's whole foreground process group. The runner answers it by
letting the episodes in flight end at their next step and recording them ``interrupted`` (run
again on resume, never counted as failed attempts); that needs their sandboxes alive. A daemon in
the runner's process group died of the same SIGINT, and an episode that noticed before the
runner's handler ran was recorded as an ordinary failed attempt (seen under load in
``tests/runner/test_runner_interrupt.py``). The daemon runs in a session of its own; it still
ends with the program that started it (its control socket closes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.needs import skip_missing

REPO = Path(__file__).resolve().parents[3]

PROGRAM = textwrap.dedent(
    """
    import sys, time
    from pool import LocalBackend
    from tests.support.backends import LIMITS, WORKSPACE_TEMPLATE

    with LocalBackend(store_dir=sys.argv[1], **LIMITS) as backend:
        with backend.create(backend.build(WORKSPACE_TEMPLATE)) as sandbox:
            try:  # the signal may come as soon as "ready" is out, before the sleep
                print("ready", flush=True)
                time.sleep(120)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
            print(sandbox.exec("cat /workspace/a").stdout.strip(), flush=True)
    """
)


def test_a_ctrl_c_leaves_the_sandboxes_running_for_the_program_to_end_cleanly(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        skip_missing("needs root (the local backend's namespaces)")
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(tmp_path / "store")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal gives a foreground job
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n", proc.stderr.read() if proc.stderr else ""
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert out == "interrupted\nhi\n", err[-3000:]
