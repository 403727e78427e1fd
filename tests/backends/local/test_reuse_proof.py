"""Kernel objects of a dead instance are reused only with proof (issue 34 item 3).

The keeper hands a dead instance's emptied cgroups (sandboxd/keeper/cgpool.c) and its
network namespace (sandboxd/keeper/netproof.c) to a later instance of the same sandbox
once it has proven them clean. Each test here first shows that an untouched
object is reused (so a planted one's absence means something), then plants one
leftover in an instance's object and expects that object never to serve again:
with the proof skipped, the planted object would come back and the test fail.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import gymnasium as gym
import pytest

import envs
from pool import LocalBackend, Snapshot
from pool.backends.local import cgroups
from pool.backends.local.sandbox import LocalSandbox
from pool.egress.onhost.netns import listen_in_netns
from tests.support.needs import skip_missing

TRIVIAL = Path(__file__).resolve().parents[3] / "benchmarks" / "tasks" / "trivial"
RESTORES = 8
"""A set given back at one restore is taken at the third one after it (two stay aging), and an emptied
network namespace serves the instance after next: eight restores leave room for either to come back."""


@pytest.fixture
def sandbox(backend: LocalBackend, snap: Snapshot) -> Iterator[LocalSandbox]:
    if os.geteuid() != 0:
        skip_missing("needs root (cgroups and network namespaces of the local backend)")
    sbx = backend.create(snap)
    assert isinstance(sbx, LocalSandbox)
    try:
        for _ in range(3):  # past the first instances, whose cgroups saw the files first read
            sbx.restore()
        yield sbx
    finally:
        sbx.close()


def _init_pid(sbx: LocalSandbox) -> int:
    return int(sbx._link.ping()["pid"])


def _memory_cgroup(pid: int) -> Path:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if cgroups._v2() and controllers == "":
            return cgroups.CGROUP_ROOT / path.lstrip("/")
        if "memory" in controllers.split(","):
            return cgroups.CGROUP_ROOT / "memory" / path.lstrip("/")
    skip_missing("needs a memory cgroup controller")


def _refusals(group: Path) -> str:
    """What this process's sandbox daemons logged about refusing ``group`` (why a proof failed)."""
    lines = [
        line
        for log in Path("/run/snapgym").glob(f"{os.getpid()}-*/daemon.log")
        for line in log.read_text(errors="replace").splitlines()
        if group.name in line
    ]
    return "; ".join(lines) or "no refusal logged (never offered)"


def _netns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _later_instances(sbx: LocalSandbox, of: Callable[[int], object]) -> list[object]:
    """``of(init pid)`` for each instance of the next RESTORES restores, with what each reused."""
    seen = []
    for _ in range(RESTORES):
        sbx.restore()
        seen.append(of(_init_pid(sbx)))
    return seen


# -- cgroups ------------------------------------------------------------------


def test_an_untouched_cgroup_is_reused_and_the_start_says_so(sandbox: LocalSandbox) -> None:
    group = _memory_cgroup(_init_pid(sandbox))
    later = _later_instances(sandbox, lambda pid: (_memory_cgroup(pid), sandbox.reused["cgroup"]))
    assert (group, True) in later, f"{group} never served again: {later}"
    assert sandbox.exec("echo ok").stdout == "ok\n"


def _plant_process(group: Path) -> Callable[[], None]:
    proc = subprocess.Popen(["sleep", "300"])
    (group / "cgroup.procs").write_text(str(proc.pid))
    return lambda: (proc.kill(), proc.wait(), None)[-1]


def _plant_charge(group: Path) -> Callable[[], None]:
    """A tmpfs file written from inside the cgroup by a process that then leaves: its pages stay charged."""
    path = Path(f"/dev/shm/snapgym-reuse-{os.getpid()}")
    root = group.parent.parent
    script = f"echo $$ > {group}/cgroup.procs && head -c 1048576 /dev/zero > {path} && echo $$ > {root}/cgroup.procs"
    subprocess.run(["sh", "-c", script], check=True)
    return lambda: path.unlink(missing_ok=True)


def _plant_limit(group: Path) -> Callable[[], None]:
    name = "memory.soft_limit_in_bytes" if (group / "memory.soft_limit_in_bytes").exists() else "memory.high"
    (group / name).write_text(str(64 << 20))
    return lambda: None


def _plant_child(group: Path) -> Callable[[], None]:
    child = group / "planted"
    child.mkdir()
    return lambda: child.rmdir() if child.exists() else None


@pytest.mark.parametrize(
    "plant",
    [_plant_process, _plant_charge, _plant_limit, _plant_child],
    ids=["process-left", "memory-charged", "limit-changed", "child-cgroup"],
)
def test_a_cgroup_with_a_leftover_is_refused_not_reused(
    sandbox: LocalSandbox, plant: Callable[[Path], Callable[[], None]]
) -> None:
    group = _memory_cgroup(_init_pid(sandbox))
    cleanup = plant(group)
    try:
        later = _later_instances(sandbox, _memory_cgroup)
    finally:
        cleanup()
    assert group not in later, f"{group} served again after {plant.__name__}"
    assert sandbox.exec("echo ok").stdout == "ok\n"


def test_a_reused_cgroup_starts_with_its_limits_and_zeroed_records(sandbox: LocalSandbox) -> None:
    group = _memory_cgroup(_init_pid(sandbox))
    for _ in range(RESTORES):
        sandbox.restore()
        if _memory_cgroup(_init_pid(sandbox)) == group:
            break
    else:
        pytest.fail(f"{group} was not reused")
    assert sandbox.reused["cgroup"]
    if (group / "memory.limit_in_bytes").exists():  # v1
        limit = int((group / "memory.limit_in_bytes").read_text())
        assert 256 << 20 <= limit <= (256 << 20) + (1 << 20)  # raised by at most the kernel objects kept
        assert int((group / "memory.failcnt").read_text()) == 0
    else:
        limit = int((group / "memory.max").read_text())
        assert 256 << 20 <= limit <= (256 << 20) + (1 << 20)


def _oom_killed_then_reused(sandbox: LocalSandbox) -> str | None:
    """An OOM kill in the current instance's memory cgroup, then restores until that cgroup serves again;
    None when it did, else why its proof refused it."""
    group = _memory_cgroup(_init_pid(sandbox))
    hog = "x = bytearray(512 << 20)"  # past the 256 MiB limit, with no swap: the OOM killer takes it
    script = f'echo $$ > {group}/cgroup.procs && exec {sys.executable} -c "{hog}"'
    # The interpreter's files are read once outside the cgroup first: a page of a file first read inside it
    # stays charged to it while another process maps it, and the proof would rightly refuse the set.
    subprocess.run(["sh", "-c", f'exec {sys.executable} -c "x = bytearray(1)"'], check=True)
    assert subprocess.run(["sh", "-c", script], capture_output=True).returncode != 0
    assert "oom_kill 1" in (group / "memory.oom_control").read_text() if cgroups._v1_controller("memory") else True
    assert sandbox.exec("echo alive").stdout == "alive\n"
    for _ in range(RESTORES):
        sandbox.restore()
        if _memory_cgroup(_init_pid(sandbox)) == group:
            return None
    return f"{group}: {_refusals(group)}"


def test_a_reused_cgroup_counts_only_its_own_instance_s_oom_kills(sandbox: LocalSandbox) -> None:
    """An OOM kill in a cgroup's past (the kernel's count cannot be zeroed) is not the next instance's."""
    # The proof may rightly refuse a set whose killed process the kernel has not finished uncharging
    # (a refused set is removed): the scenario is played again, with another set, up to three times.
    refused = []
    while len(refused) < 3 and (why := _oom_killed_then_reused(sandbox)) is not None:
        refused.append(why)
    if len(refused) == 3:
        pytest.fail(f"no OOM-killed cgroup was reused: {refused}")
    os.kill(_init_pid(sandbox), signal.SIGKILL)  # killed from the host: not by the OOM killer
    deadline = time.monotonic() + 5
    while sandbox.is_alive and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not sandbox.died_of_oom


# -- network namespaces -------------------------------------------------------


def test_an_untouched_network_namespace_is_reused_and_the_start_says_so(sandbox: LocalSandbox) -> None:
    net = _netns(_init_pid(sandbox))
    later = _later_instances(sandbox, lambda pid: (_netns(pid), sandbox.reused["netns"]))
    assert (net, True) in later, f"{net} never served again: {later}"


def _in_netns(pid: int, *command: str) -> None:
    subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", *command], check=True, capture_output=True)


def _plant_socket(pid: int) -> Callable[[], None]:
    listener: socket.socket = listen_in_netns(f"/proc/{pid}/ns/net", 4711)
    return listener.close


def _plant_route(pid: int) -> Callable[[], None]:
    _in_netns(pid, "ip", "route", "add", "10.77.0.0/16", "dev", "lo")
    return lambda: None


def _plant_address(pid: int) -> Callable[[], None]:
    _in_netns(pid, "ip", "address", "add", "10.78.0.1/32", "dev", "lo")
    return lambda: None


def _plant_firewall_rule(pid: int) -> Callable[[], None]:
    try:
        _in_netns(pid, "iptables", "-A", "OUTPUT", "-d", "10.79.0.1", "-j", "DROP")
    except (OSError, subprocess.CalledProcessError) as exc:
        skip_missing(f"needs iptables that can add a rule here ({exc})")
    return lambda: None


def _plant_sysctl(pid: int) -> Callable[[], None]:
    _in_netns(pid, "sh", "-c", "echo 17 > /proc/sys/net/core/somaxconn")
    return lambda: None


@pytest.mark.parametrize(
    "plant",
    [_plant_socket, _plant_route, _plant_address, _plant_firewall_rule, _plant_sysctl],
    ids=["socket", "route", "address", "iptables-rule", "sysctl"],
)
def test_a_network_namespace_with_a_leftover_is_refused_not_reused(
    sandbox: LocalSandbox, plant: Callable[[int], Callable[[], None]]
) -> None:
    pid = _init_pid(sandbox)
    net = _netns(pid)
    cleanup = plant(pid)
    try:
        later = _later_instances(sandbox, _netns)
    finally:
        with contextlib.suppress(OSError):
            cleanup()
    assert net not in later, f"{net} served again after {plant.__name__}"
    assert sandbox.exec("echo ok").stdout == "ok\n"


_NETWORK_VIEW = "cat /proc/net/dev /proc/net/snmp /proc/net/snmp6 /proc/net/netstat /proc/net/ip6_flowlabel"
"""What an agent can read of its network namespace's history: counters and lingering IPv6 flow labels."""

_SEND_PACKETS = "import socket\nfor _ in range(20): socket.socket().connect_ex(('127.0.0.1', 9))"
"""Twenty refused connections over loopback: the interface's and TCP's counters go up and stay up."""

_LEAVE_FLOW_LABEL = (
    "import socket, struct\n"
    "s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
    "dst = socket.inet_pton(socket.AF_INET6, '::1')\n"
    "# IPV6_FLOWLABEL_MGR: get label 0x12345, create it, exclusive, lingering 6 s after the socket\n"
    "s.setsockopt(socket.IPPROTO_IPV6, 32, struct.pack('16sIBBHHHI', dst, socket.htonl(0x12345), 0, 1, 1, 6, 6, 0))\n"
    "s.close()"
)
"""A value of the agent's choosing, left behind in the namespace for the next episode to read."""

_FLOOD_FLOW_LABELS = (
    "import socket, struct\n"
    "dst = socket.inet_pton(socket.AF_INET6, '::1')\n"
    "for sock in range(24):\n"
    "    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
    "    for label in range(32):  # a socket may hold 32\n"
    "        value = socket.htonl(0x10000 + 32 * sock + label)\n"
    "        s.setsockopt(socket.IPPROTO_IPV6, 32, struct.pack('16sIBBHHHI', dst, value, 0, 1, 1, 6, 6, 0))\n"
    "    s.close()"
)
"""768 lingering labels: about 60 KB of ``ip6_flowlabel``, more than the keeper's proof reads (32 KB)."""


@pytest.mark.parametrize(
    "leave",
    [_SEND_PACKETS, _LEAVE_FLOW_LABEL, _FLOOD_FLOW_LABELS],
    ids=["packet-counters", "ipv6-flow-label", "more-flow-labels-than-the-proof-reads"],
)
def test_an_agent_leaves_nothing_in_the_network_namespace_for_a_later_episode(
    sandbox: LocalSandbox, leave: str
) -> None:
    """The kernel never zeroes a namespace's counters, and a flow label outlives its socket: a namespace that
    holds either is torn down, not handed to a later instance (which would read what this episode did)."""
    quiet = sandbox.exec(_NETWORK_VIEW)
    assert quiet.exit_code == 0, quiet.stderr
    left = sandbox.exec(f"python3 -c {shlex.quote(leave)} && {_NETWORK_VIEW}")
    assert left.exit_code == 0, left.stderr
    assert left.stdout != quiet.stdout  # the agent did leave a trace in its own namespace
    net = _netns(_init_pid(sandbox))
    later = _later_instances(sandbox, lambda pid: (_netns(pid), sandbox.exec(_NETWORK_VIEW).stdout))
    assert net not in [ns for ns, _ in later], f"{net} served again after the agent used it"
    assert all(view == quiet.stdout for _, view in later), "a later episode reads another's network history"
    # The keeper's proof still works (nothing of it was overwritten): quiet namespaces are reused again.
    assert any(reused for reused in _later_instances(sandbox, lambda pid: sandbox.reused["netns"]))


# -- records ------------------------------------------------------------------


def test_each_episode_s_info_records_what_its_instance_reused(backend: LocalBackend) -> None:
    if os.geteuid() != 0:
        skip_missing("needs root (cgroups and network namespaces of the local backend)")
    env = gym.make("snapgym/Shell-v0", task=str(TRIVIAL), backend=backend, max_steps=3)
    try:
        seen = []
        for _ in range(6):
            _, info = env.reset()
            seen.append(info["reused"])
            env.step("echo ok > /app/answer.txt")
            _, reward, *_ = env.step(envs.SUBMIT)
            assert reward == 1.0
    finally:
        env.close()
    assert seen[0] == {"cgroup": False, "netns": False}  # the sandbox's first instance: nothing to reuse
    assert {"cgroup": True, "netns": True} in seen[1:], seen
