"""The local backend's persistent shell (``sandbox.shell``, behind snapgym/Shell-v0): one bash per
episode, and what a hostile agent can and cannot do with it.

The shell is the agent's own, so it may lie about its own steps; these tests pin what must hold
anyway: every step ends by its deadline, a timeout kills what the step started and nothing an
earlier step left running, the harness never hangs or mixes up episodes, and the verifier is
untouched by the session.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import LocalBackend
from pool.contract import SHELL_STATE_FILE
from pool.errors import CommandRejectedError, SandboxError, UnsupportedError
from pool.snapshots import Snapshot
from pool.templates import Template
from pool.verification import VerificationPlan, VerifyMode
from tests.backends.local.test_rootfs_base import _minimal_rootfs


@pytest.fixture(scope="module")
def snapshot(backend: LocalBackend) -> Snapshot:
    return backend.build(Template(name="shell-session", workdir="/app", setup=["mkdir -p /app"]))


@pytest.fixture
def sandbox(backend: LocalBackend, snapshot: Snapshot) -> Iterator:
    box = backend.create(snapshot)
    yield box
    box.close()


def alive(box, seconds: str) -> bool:
    """Whether a ``sleep SECONDS`` runs in the sandbox."""
    listing = box.exec("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null").stdout
    return f"sleep {seconds} " in listing.splitlines()


def test_the_shell_keeps_directory_variables_and_functions(sandbox) -> None:
    """Steps share one bash; restore() starts the next episode's from scratch."""
    assert sandbox.shell("cd /tmp; X=1; export Y=2; f() { echo fn; }").exit_code == 0
    result = sandbox.shell("pwd; echo $X $Y; f")
    assert (result.exit_code, result.stdout) == (0, "/tmp\n1 2\nfn\n")
    first_pid = sandbox.shell("echo $$").stdout
    assert sandbox.shell("echo $$").stdout == first_pid
    sandbox.restore()
    assert sandbox.shell("pwd; echo ${X-unset} ${Y-unset}").stdout == "/app\nunset unset\n"


def test_exit_codes_stderr_and_stdin(sandbox) -> None:
    """A step's exit code and stderr are its own; commands read an empty stdin, never the next step."""
    result = sandbox.shell("echo out; echo err >&2; false")
    assert (result.exit_code, result.stdout, result.stderr) == (1, "out\n", "err\n")
    assert sandbox.shell("cat; read -r line; echo rc=$?").stdout == "rc=1\n"
    assert sandbox.shell("echo after").stdout == "after\n"


def test_exit_ends_the_shell_and_the_next_step_starts_where_it_was(sandbox) -> None:
    """`exit 3` is the step's exit code; the next shell starts in the last directory with the exported variables."""
    sandbox.shell("mkdir -p /tmp/w && cd /tmp/w; export KEEP=yes; LOST=1")
    assert sandbox.shell("exit 3").exit_code == 3
    assert sandbox.shell("pwd; echo $KEEP ${LOST-unset}").stdout == "/tmp/w\nyes unset\n"


def test_a_timeout_kills_what_the_step_started_and_spares_what_earlier_steps_left(sandbox) -> None:
    """A server started by an earlier step survives a later step's timeout; the timed-out step's
    processes (foreground and background) are gone; the next step works, in the same directory."""
    sandbox.shell("cd /tmp; nohup sleep 1001 >/dev/null 2>&1 & (sleep 1002 &) ; true")
    started = time.monotonic()
    result = sandbox.shell("sleep 1003 & sleep 1004", timeout_s=1.0)
    assert result.timed_out and result.exit_code == 137
    assert time.monotonic() - started < 5
    assert alive(sandbox, "1001") and alive(sandbox, "1002")
    assert not alive(sandbox, "1003") and not alive(sandbox, "1004")
    assert sandbox.shell("pwd").stdout == "/tmp\n"


def test_a_busy_loop_in_the_shell_itself_is_stopped(sandbox) -> None:
    """A loop of builtins runs in the shell process: the timeout ends the shell, not just a child."""
    result = sandbox.shell("while :; do :; done", timeout_s=0.5)
    assert result.timed_out
    assert sandbox.shell("echo ok").stdout == "ok\n"


def test_a_forged_step_report_does_not_escape_the_harness(sandbox) -> None:
    """The agent writes a fake exit code on the shell's report descriptor: its own step looks done
    early (its own observation), but no step runs past its deadline and the shell recovers."""
    forged = sandbox.shell("echo 0 >&3; sleep 3; echo late", timeout_s=10)
    assert forged.exit_code == 0 and forged.duration_s < 2.5
    following = sandbox.shell("echo next", timeout_s=1.0)  # queued behind the sleep: times out
    assert following.timed_out
    assert sandbox.shell("echo fine", timeout_s=5).stdout == "fine\n"


def test_closing_the_report_descriptor_costs_only_a_timeout(sandbox) -> None:
    """The agent closes the descriptor its shell reports on: that step times out, and the next shell works."""
    assert sandbox.shell("exec 3>&-", timeout_s=0.5).timed_out
    assert sandbox.shell("echo back", timeout_s=5).stdout == "back\n"


def test_killing_the_shells_reaper_ends_the_step_not_the_sandbox(sandbox) -> None:
    """`kill -9 $PPID` (the session's reaper): the step reports 137, the sandbox lives, a new shell starts."""
    result = sandbox.shell("kill -9 $PPID; sleep 1", timeout_s=5)
    assert result.exit_code == 137
    assert sandbox.shell("echo again", timeout_s=5).stdout == "again\n"


def test_a_thief_of_the_shells_input_cannot_hang_the_harness(sandbox) -> None:
    """A background reader of the shell's own stdin swallows later steps: they time out, nothing hangs."""
    sandbox.shell("cat /proc/$$/fd/0 > /tmp/stolen 2>/dev/null &")
    # the thief is running (not a subshell still on its way to exec cat) before pkill looks for it
    sandbox.exec("for i in $(seq 100); do pgrep -f 'cat /proc' >/dev/null && break; sleep 0.05; done")
    started = time.monotonic()
    results = [sandbox.shell("echo mine", timeout_s=0.5) for _ in range(2)]
    assert time.monotonic() - started < 10
    assert any(r.timed_out for r in results) or all(r.stdout == "mine\n" for r in results)
    sandbox.exec("pkill -f 'cat /proc' || true")
    assert sandbox.shell("echo ok", timeout_s=5).stdout == "ok\n"


def test_an_output_flood_is_capped_and_the_shell_goes_on(sandbox) -> None:
    result = sandbox.shell("head -c 5000000 /dev/zero | tr '\\0' x", max_output_bytes=1000)
    assert result.stdout_truncated and len(result.stdout) == 1000
    assert sandbox.shell("echo small").stdout == "small\n"


def test_bad_commands_are_rejected_before_the_shell(sandbox) -> None:
    with pytest.raises(CommandRejectedError, match="NUL"):
        sandbox.shell("echo a\0b")
    with pytest.raises(CommandRejectedError, match="timeout_s"):
        sandbox.shell("true", timeout_s=0)
    assert sandbox.shell("echo still").stdout == "still\n"


def strict_plan(tmp_path: Path, snapshot: Snapshot) -> VerificationPlan:
    tests = tmp_path / "tests"
    tests.mkdir(exist_ok=True)
    (tests / "test.sh").write_text("true\n")
    return VerificationPlan(VerifyMode.STRICT, tests, outputs=("/app",), known_good=snapshot)


def test_the_verifier_never_gets_the_agents_shell(sandbox, snapshot: Snapshot, tmp_path: Path) -> None:
    """After begin_verification the shell is closed and refused; exec() is the verifier's."""
    sandbox.shell("cd /tmp; export AGENT=1")
    sandbox.begin_verification(strict_plan(tmp_path, snapshot))
    with pytest.raises(SandboxError, match="sealed"):
        sandbox.shell("true")
    result = sandbox.exec("pwd; echo ${AGENT-unset}")
    assert result.stdout == "/app\nunset\n"


def test_the_state_file_is_the_shells_not_the_verifiers(sandbox, snapshot: Snapshot, tmp_path: Path) -> None:
    """The state file lives in the agent's layer; a strict verifier's exec never sources it."""
    sandbox.shell("echo 'echo forged > /tmp/x' >> " + SHELL_STATE_FILE)
    sandbox.begin_verification(strict_plan(tmp_path, snapshot))
    assert sandbox.exec("cat /tmp/x 2>/dev/null || echo none").stdout == "none\n"


def test_a_base_without_bash_says_so(backend: LocalBackend, tmp_path: Path) -> None:
    """No bash in the sandbox: shell() raises UnsupportedError (Shell-v0 then runs each step in sh)."""
    tree = tmp_path / "rootfs"
    _minimal_rootfs(tree)  # sh and a few tools, no bash
    snap = backend.build(Template(name="no-bash", base=str(tree), workdir="/"))
    with backend.create(snap) as box:
        for _ in range(300):  # the step may reach the daemon just as the shell dies: never a timeout
            with pytest.raises(UnsupportedError, match="no bash"):
                box.shell("true")
        assert box.exec("echo sh works").stdout == "sh works\n"
