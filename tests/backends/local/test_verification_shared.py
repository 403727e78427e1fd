"""Shared verification on the local backend: beside the agent's live processes, with private tests and reward."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import LocalBackend, LocalSandbox, Snapshot, Template
from pool.verification import VerificationPlan, VerifyMode
from tests.support.needs import skip_missing

APP = Template(
    name="tests-verify-shared",
    setup=["mkdir -p /app && echo start > /app/given && mkdir -p /etc/profile.d && echo '# known' > /etc/known.conf"],
    workdir="/app",
)
SERVER = (
    "import http.server, socketserver\n"
    "socketserver.TCPServer(('127.0.0.1', 8099), http.server.SimpleHTTPRequestHandler).serve_forever()\n"
)


@pytest.fixture(scope="module")
def tests_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("shared-tests")
    (folder / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return folder


@pytest.fixture(scope="module")
def app(backend: LocalBackend) -> Snapshot:
    return backend.build(APP)


@pytest.fixture()
def sandbox(backend: LocalBackend, app: Snapshot) -> Iterator[LocalSandbox]:
    with backend.create(app) as sbx:
        yield sbx


def shared(tests: Path) -> VerificationPlan:
    return VerificationPlan(VerifyMode.SHARED, tests)


def test_the_verifier_reaches_the_agents_service_and_sees_its_files(sandbox: LocalSandbox, tests_dir: Path) -> None:
    sandbox.write_file("/app/server.py", SERVER)
    sandbox.exec("echo served > /app/page && echo mine > /etc/myservice.conf")
    sandbox.exec("(setsid python3 /app/server.py >/dev/null 2>&1 &); sleep 0.5")
    sandbox.begin_verification(shared(tests_dir))
    r = sandbox.exec(
        "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8099/page').read().decode())\";"
        " cat /etc/myservice.conf; pgrep -fc '^python3 /app/server'"
    )
    assert r.stdout == "served\n\nmine\n1\n", r.stderr


def test_tests_and_reward_are_private_to_the_verifier(sandbox: LocalSandbox, tests_dir: Path) -> None:
    """The agent's live processes write into their own /logs and /tests; the verifier never sees either."""
    sandbox.exec(
        "(setsid sh -c 'while true; do mkdir -p /logs/verifier /tests; echo 1 > /logs/verifier/reward.txt;"
        " echo hacked > /tests/test.sh; sleep 0.01; done' >/dev/null 2>&1 &)"
    )
    sandbox.begin_verification(shared(tests_dir))
    r = sandbox.exec("sleep 0.2; ls -A /logs/verifier; cat /tests/test.sh; echo 0 > /logs/verifier/reward.txt")
    assert r.stdout == "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"
    assert sandbox.read_file("/logs/verifier/reward.txt", follow_symlinks=False) == b"0\n"


def test_loader_shell_and_python_hooks_come_from_the_known_good_snapshot(
    sandbox: LocalSandbox, tests_dir: Path
) -> None:
    sandbox.exec(
        "echo /app/evil.so > /etc/ld.so.preload && echo 'export X=1' > /etc/profile.d/x.sh"
        " && echo 'export X=1' >> /root/.bashrc && mkdir -p /root/.local/lib/python3.11/site-packages"
        ' && echo \'import os; os.environ["PWNED"]="1"\' > /root/.local/lib/python3.11/site-packages/a.pth'
        " && rm /bin && ln -s /app /bin && echo '# agent' >> /etc/known.conf"
    )
    sandbox.begin_verification(shared(tests_dir))
    r = sandbox.exec(
        "test -e /etc/ld.so.preload && echo preload; ls /etc/profile.d | grep -c x.sh; grep -sc X= /root/.bashrc;"
        ' python3 -c \'import os; print(os.environ.get("PWNED", "clean"))\'; readlink /bin; tail -1 /etc/known.conf'
    )
    assert r.stdout == "0\nclean\nusr/bin\n# agent\n", r.stderr  # other /etc changes are the agent's to show


@pytest.mark.parametrize("attack", ["kill -STOP", "kill -KILL", "cat /proc/{}/environ", "ptrace"])
def test_the_agents_processes_cannot_signal_or_trace_the_verifier(
    backend: LocalBackend, sandbox: LocalSandbox, tests_dir: Path, attack: str
) -> None:
    """A watcher the agent left running attacks every process that appears; none of the verifier's is hurt."""
    isolation = backend.capabilities.verifier_isolation
    if attack.startswith("kill") and isolation != "signals+ptrace":
        skip_missing(f"this kernel's Landlock does not scope signals (verifier_isolation={isolation!r})")
    if isolation == "none":
        skip_missing("this kernel has no Landlock: shared verifiers are not protected from the agent's processes")
    act = {
        "kill -STOP": "os.kill(pid, signal.SIGSTOP)",
        "kill -KILL": "os.kill(pid, signal.SIGKILL)",
        "cat /proc/{}/environ": "open(f'/proc/{pid}/environ').read()",
        "ptrace": "assert libc.ptrace(16, pid, 0, 0) == 0, ctypes.get_errno()",  # PTRACE_ATTACH
    }[attack]
    watcher = (
        "import ctypes, os, signal, time\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "seen = set(os.listdir('/proc'))\nlog = open('/app/watch.log', 'w', buffering=1)\n"
        "while True:\n    for p in os.listdir('/proc'):\n        if p.isdigit() and p not in seen:\n"
        "            seen.add(p); pid = int(p)\n            try:\n"
        f"                {act}\n                log.write(f'hit {{pid}}\\n')\n"
        "            except Exception as e:\n                log.write(f'missed {pid}: {e!r}\\n')\n"
        "    time.sleep(0.001)\n"
    )
    sandbox.write_file("/app/watch.py", watcher)
    sandbox.exec("(setsid python3 /app/watch.py </dev/null >/dev/null 2>&1 &); sleep 0.3")
    sandbox.begin_verification(shared(tests_dir))
    r = sandbox.exec("sleep 0.3; echo verifier ran; sleep 0.2; cat /app/watch.log", timeout_s=20)
    assert r.ok and r.stdout.startswith("verifier ran\n"), (r.exit_code, r.stdout, r.stderr)
    log = r.stdout.split("\n", 1)[1]
    assert "missed" in log and "hit" not in log, log


def test_restore_ends_the_shared_verification(sandbox: LocalSandbox, tests_dir: Path) -> None:
    sandbox.exec("(setsid sleep 300 &) ; echo agent > /app/x")
    sandbox.begin_verification(shared(tests_dir))
    assert sandbox.exec("cat /app/x").stdout == "agent\n"
    sandbox.restore()
    assert sandbox.sealed is None
    assert sandbox.exec("ls /app; pgrep -c sleep; ls /tests 2>&1 | head -1").stdout == (
        "given\n0\nls: cannot access '/tests': No such file or directory\n"
    )


def test_links_into_the_verifiers_private_paths_are_removed_in_shared_mode_too(
    sandbox: LocalSandbox, tests_dir: Path
) -> None:
    """A link the agent left from its files to /tests (where the expected answers are) is gone for the verifier."""
    sandbox.exec("ln -s /tests/test.sh /app/answer && mkdir -p /srv/x && ln -s ../../logs/verifier /srv/x/r")
    report = sandbox.begin_verification(shared(tests_dir))
    assert set(report.removed_links) == {"/app/answer -> /tests/test.sh", "/srv/x/r -> ../../logs/verifier"}
    assert sandbox.exec("ls -A /app /srv/x").stdout == "/app:\ngiven\n\n/srv/x:\n"


def frozen(tests: Path) -> VerificationPlan:
    return VerificationPlan(VerifyMode.SHARED, tests, outputs=("/app",))


def test_outputs_are_frozen_as_the_turn_left_them_while_the_rest_stays_live(
    sandbox: LocalSandbox, tests_dir: Path
) -> None:
    """A loop the agent left running waits for the verifier, then rewrites the clock files and swaps its
    answer for a link to /tests: the verifier reads the outputs as the turn left them, while a file
    outside the outputs changes under its eyes."""
    sandbox.exec(
        "echo final > /app/answer; date +%s%N > /app/clock; date +%s%N > /tmp/clock;"
        " (setsid sh -c 'sleep 0.3; while true; do date +%s%N > /app/clock; date +%s%N > /tmp/clock;"
        " ln -sfn /tests/test.sh /app/answer; sleep 0.01; done' >/dev/null 2>&1 &)"
    )
    report = sandbox.begin_verification(frozen(tests_dir))
    r = sandbox.exec(
        "a=$(cat /app/clock); b=$(cat /tmp/clock); sleep 0.6; c=$(cat /app/clock); d=$(cat /tmp/clock);"
        ' [ "$a" = "$c" ] && echo app frozen; [ "$b" != "$d" ] && echo tmp live;'
        " test -L /app/answer && echo link; cat /app/answer; echo verifier >> /app/clock"
    )
    assert r.stdout == "app frozen\ntmp live\nfinal\n", (r.stdout, r.stderr)
    assert report.removed_links == () and report.missing_outputs == ()


def test_a_service_on_a_unix_socket_in_a_frozen_output_is_still_reached(sandbox: LocalSandbox, tests_dir: Path) -> None:
    server = (
        "import socket, os\ns = socket.socket(socket.AF_UNIX)\ns.bind('/app/kv.sock')\ns.listen()\n"
        "while True:\n    c, _ = s.accept()\n    c.sendall(b'pong from ' + str(os.getpid()).encode())\n    c.close()\n"
    )
    sandbox.write_file("/app/server.py", server)
    sandbox.exec("(setsid python3 /app/server.py >/dev/null 2>&1 &); sleep 0.5; mkfifo /app/pipe")
    sandbox.begin_verification(frozen(tests_dir))
    r = sandbox.exec(
        "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('/app/kv.sock');"
        ' print(s.recv(100).decode())"; test -p /app/pipe && echo fifo'
    )
    assert r.stdout.startswith("pong from ") and r.stdout.endswith("\nfifo\n"), (r.stdout, r.stderr)


def test_a_deleted_output_is_shown_empty_and_reported_missing(sandbox: LocalSandbox, tests_dir: Path) -> None:
    sandbox.exec("rm -rf /app")
    report = sandbox.begin_verification(frozen(tests_dir))
    assert report.missing_outputs == ("/app",)
    assert sandbox.exec("ls -A /app && echo empty").stdout == "empty\n"


def test_a_huge_sparse_output_is_frozen_without_filling_anything(sandbox: LocalSandbox, tests_dir: Path) -> None:
    """A 1 TiB sparse file in the outputs is copied hole by hole, and a deep tree level by level."""
    sandbox.exec("truncate -s 1T /app/huge && echo tail >> /app/huge && mkdir -p /app/deep")
    sandbox.exec("cd /app/deep && for i in $(seq 300); do mkdir d && cd d; done; echo bottom > leaf")
    sandbox.begin_verification(frozen(tests_dir))
    r = sandbox.exec("stat -c %s /app/huge; tail -c 5 /app/huge; du -k /app/huge | cut -f1; find /app/deep -name leaf")
    lines = r.stdout.split("\n")
    assert len(lines) == 5 and lines[:2] == [str(2**40 + 5), "tail"], (r.stdout, r.stderr)
    assert int(lines[2]) < 1024 and lines[3] == "/app/deep" + "/d" * 300 + "/leaf"


def test_outputs_the_copy_cannot_hold_whole_still_verify(sandbox: LocalSandbox, tests_dir: Path) -> None:
    """An agent hiding its failure behind the freeze (a tree deeper than any path, a device node or FIFO, a
    folder nobody may read, a socket nobody serves) gets a verifier all the same: the rest is shown."""
    sandbox.exec(
        "cd /app && (mknod null-dev c 1 3 2>/dev/null || mkfifo null-dev) && mkdir locked && echo x > locked/f"
        " && chmod 000 locked"
        " && python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('/app/dead.sock')\""
        " && mkdir deep && cd deep && for i in $(seq 2500); do mkdir d && cd d || exit 1; done && echo leaf > leaf",
        timeout_s=60,
    )
    sandbox.exec("echo answer > /app/answer")
    sandbox.begin_verification(frozen(tests_dir))
    r = sandbox.exec("cat /app/answer; cat /app/locked/f; test -S /app/dead.sock && echo sock; ls /app | wc -l")
    assert r.stdout == "answer\nx\nsock\n6\n", (r.stdout, r.stderr)
