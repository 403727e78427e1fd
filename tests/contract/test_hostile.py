"""Hostile commands stay inside their sandbox, and the host side keeps working."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator

import pytest

from pool import CommandRejectedError, LocalBackend, LocalSandbox, SandboxCrashedError, Snapshot
from pool.backends.local.daemon.client import Op


@pytest.fixture()
def sandbox(backend: LocalBackend, snap: Snapshot) -> Iterator[LocalSandbox]:
    with backend.create(snap) as sbx:
        yield sbx


def test_stdout_flood_is_capped_and_never_stalls(sandbox: LocalSandbox) -> None:
    r = sandbox.exec("yes flood", timeout_s=2, max_output_bytes=64 * 1024)
    assert r.timed_out and r.stdout_truncated
    assert len(r.stdout) == 64 * 1024
    r = sandbox.exec("head -c 20000000 /dev/zero; echo done >&2")  # 20 MB, default 1 MiB cap
    assert r.exit_code == 0 and r.stdout_truncated and len(r.stdout) == 1 << 20 and r.stderr == "done\n"


def test_invalid_utf8_and_binary_output_decode_without_error(sandbox: LocalSandbox) -> None:
    r = sandbox.exec("printf '\\377\\376\\000abc'; head -c 4096 /dev/urandom >&2")
    assert r.exit_code == 0
    assert r.stdout.endswith("\x00abc") and "\ufffd" in r.stdout
    assert isinstance(r.stderr, str)


def test_timeout_kills_sigterm_ignoring_and_setsid_processes(sandbox: LocalSandbox) -> None:
    script = "trap '' TERM; (setsid sh -c \"trap '' TERM; sleep 300\" &); sleep 300"
    started = time.monotonic()
    r = sandbox.exec(script, timeout_s=1)
    assert r.timed_out and r.exit_code == 137
    assert time.monotonic() - started < 10
    left = sandbox.exec("ps -eo args | grep -c '^sleep 300' || true").stdout.strip()
    assert left == "0"


def test_fork_bomb_stays_inside(backend: LocalBackend, sandbox: LocalSandbox, snap: Snapshot) -> None:
    r = sandbox.exec("bomb() { bomb | bomb & }; bomb; sleep 2", timeout_s=5)
    assert r.timed_out or r.exit_code != 0 or r.ok
    with backend.create(snap) as neighbour:  # the host and other sandboxes still work
        assert neighbour.exec("echo alive").stdout == "alive\n"
    sandbox.restore()
    assert sandbox.exec("echo recovered").stdout == "recovered\n"


def test_memory_bomb_is_killed_inside(backend: LocalBackend, sandbox: LocalSandbox) -> None:
    r = sandbox.exec("python3 -c 'x = bytearray(1 << 30); print(len(x))'", timeout_s=30)
    assert r.exit_code != 0  # 1 GiB against a 256 MiB limit: MemoryError or OOM kill
    assert sandbox.exec("echo alive").stdout == "alive\n" or not sandbox.is_alive
    sandbox.restore()
    assert sandbox.exec("echo alive").stdout == "alive\n"


def test_disk_fill_hits_the_writable_layer_limit(sandbox: LocalSandbox) -> None:
    r = sandbox.exec("dd if=/dev/zero of=/workspace/fill bs=1M count=200 2>&1", timeout_s=30)
    assert r.exit_code != 0 and "No space left" in r.stdout
    sandbox.restore()
    assert sandbox.exec("df -m /workspace | tail -1").exit_code == 0


def test_host_secrets_and_paths_are_not_visible(sandbox: LocalSandbox) -> None:
    canary = f"canary-{os.getpid()}-{time.time_ns()}"
    home_file = os.path.join(os.path.expanduser("~"), f".snapgym-secret-{os.getpid()}")
    with open(home_file, "w") as fh:
        fh.write(canary)
    os.environ["SNAPGYM_TEST_CANARY"] = canary
    try:
        r = sandbox.exec(
            "env; cat /proc/1/environ /proc/self/environ 2>/dev/null; ls -a /root /home; "
            f"cat {home_file} 2>&1; ls /run /var/run 2>/dev/null; cat /etc/shadow 2>&1; "
            "ls /tmp/ray 2>&1; ls /work /old_root 2>&1"
        )
    finally:
        del os.environ["SNAPGYM_TEST_CANARY"]
        os.unlink(home_file)
    assert canary not in r.stdout
    assert "No such file" in r.stdout  # /etc/shadow, /tmp/ray, /work
    assert sandbox.exec("test -e /var/run/docker.sock || test -e /run/docker.sock").exit_code != 0
    # Sandbox root is not host root: the host-owned userland is read-only.
    assert sandbox.exec("touch /usr/bin/pwned").exit_code != 0
    assert "NoNewPrivs:\t1" in sandbox.exec("cat /proc/self/status").stdout


def test_host_ports_are_unreachable(sandbox: LocalSandbox) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        probe = (
            f"import socket,sys\ns=socket.socket(); s.settimeout(2)\nsys.exit(s.connect_ex(('127.0.0.1', {port})))\n"
        )
        sandbox.write_file("/tmp/probe.py", probe)
        assert sandbox.exec("python3 /tmp/probe.py").exit_code != 0
        r = sandbox.exec("python3 -c \"import socket; print(socket.getaddrinfo('example.com', 80))\"", timeout_s=10)
        assert r.exit_code != 0  # no DNS, no route: loopback only
    finally:
        server.close()


def test_kill_all_processes_from_inside_does_not_break_the_sandbox(sandbox: LocalSandbox) -> None:
    r = sandbox.exec("kill -9 -1", timeout_s=5)
    assert r.exit_code == 137
    assert sandbox.is_alive
    assert sandbox.exec("echo still here").stdout == "still here\n"


def test_privileged_operations_fail_inside(sandbox: LocalSandbox) -> None:
    r = sandbox.exec("mount -t tmpfs none /workspace 2>&1; echo rc=$?; hostname evil 2>&1; echo rc=$?")
    assert r.stdout.count("rc=0") == 0
    assert sandbox.exec("ls /workspace").stdout == "a\nsrc\n"
    # Nested namespaces (the usual first step of a kernel exploit) are refused by seccomp.
    r = sandbox.exec(
        "unshare -U true 2>&1; echo rc=$?; unshare -n true 2>&1; echo rc=$?; grep Seccomp: /proc/self/status"
    )
    assert r.stdout.count("rc=0") == 0 and "Seccomp:\t2" in r.stdout
    # Ordinary process creation still works: threads, fork, exec.
    script = "import threading, subprocess; threading.Thread().start(); subprocess.run(['true'])"
    r = sandbox.exec(f'python3 -c "{script}"')
    assert r.exit_code == 0, r.stderr


def test_bad_commands_are_rejected_with_clear_errors(sandbox: LocalSandbox) -> None:
    with pytest.raises(CommandRejectedError, match="limit"):
        sandbox.exec("echo " + "x" * (200 * 1024))
    with pytest.raises(CommandRejectedError, match="NUL"):
        sandbox.exec("echo a\0b")
    with pytest.raises(CommandRejectedError, match="str"):
        sandbox.exec(b"echo bytes")  # type: ignore[arg-type]
    with pytest.raises(CommandRejectedError, match="timeout"):
        sandbox.exec("true", timeout_s=0)
    big = b"y" * (8 << 20)
    sandbox.write_file("/tmp/big", big)  # large data goes through files or stdin
    assert sandbox.exec("wc -c < /tmp/big").stdout.strip() == str(len(big))
    assert sandbox.exec("wc -c", stdin=big).stdout.strip() == str(len(big))


def test_init_killed_from_the_host_is_reported_and_restore_recovers(sandbox: LocalSandbox) -> None:
    pid = int(sandbox._runtime.request(Op.PING, sandbox.number, [])["pid"])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while sandbox.is_alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not sandbox.is_alive
    with pytest.raises(SandboxCrashedError, match="restore"):
        sandbox.exec("true")
    sandbox.restore()
    assert sandbox.exec("echo back").stdout == "back\n"


def test_a_runner_stopped_from_inside_is_a_timeout_not_a_crash(sandbox: LocalSandbox) -> None:
    """A background process that stops every new process makes the next command time out (the agent's doing)."""
    stopper = (
        "import os, signal, time\nseen = set(os.listdir('/proc'))\nwhile True:\n"
        "    for p in os.listdir('/proc'):\n        if p.isdigit() and p not in seen:\n            seen.add(p)\n"
        "            try:\n                os.kill(int(p), signal.SIGSTOP)\n"
        "            except OSError:\n                pass\n"
        "    time.sleep(0.001)\n"
    )
    sandbox.write_file("/tmp/stopper.py", stopper)
    sandbox.exec("(setsid python3 /tmp/stopper.py </dev/null >/dev/null 2>&1 &); sleep 0.5")
    r = sandbox.exec("sleep 0.2; echo never", timeout_s=0.5)  # alive long enough for the stopper's next scan
    assert r.timed_out and r.exit_code == 137  # the host gave up on it after the grace period
    assert sandbox.is_alive
    sandbox.restore()
    assert sandbox.exec("echo back").stdout == "back\n"
