"""The runner's side of an egress gate, timed alone: what a sandbox's network policy costs per instance.

Every instance of a sandbox on this machine gets a gate of the egress proxy
(:mod:`pool.egress.onhost.gatekeeper`): a listener made in its network
namespace by the proxy's helper thread, handed to the proxy's event loop, and
closed (its records drained) when the instance ends. A strict episode has two
instances, so two gates. This times the gatekeeper's ``apply`` and ``detach``
on two network namespaces in turn, as a strict episode uses them (the agent's
policy, then the verifier's), ``repetitions`` times after a warm-up, and
reports the process's user and kernel time per gate (every thread's: the
caller's, the helper's and the loop's), with the machine's kernel threads' time
over the same loop beside it, as :mod:`~benchmarks.scenarios.cost.kernelops`
does for the kernel's operations.
Nothing connects: this is the price of having the gate, not of using it.

Run as ``python -m benchmarks.scenarios.cost.gateops REPETITIONS`` (root: the helper joins the
namespaces); prints a JSON object ``{NAME: {"us_per_op": ..., "kernel_threads_us_per_op": ...}}``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

from benchmarks.scenarios.cost.kernelops import kernel_threads_s
from pool.egress.onhost.service import EgressService
from pool.egress.settings import EgressSettings
from pool.network.policy import NetworkPolicy, Phase

NAME = "egress gate (the runner's threads; 2 per strict episode)"
"""The operation's name in the cost scenario's table of operations."""


def measure(repetitions: int) -> dict[str, dict[str, float]]:
    """CPU microseconds per gate opened and closed, the process's and the kernel threads' (see the module
    docstring)."""
    holders = [subprocess.Popen(["unshare", "--net", "sleep", "600"]) for _ in range(2)]
    service = EgressService(EgressSettings())
    try:
        paths = [f"/proc/{holder.pid}/ns/net" for holder in holders]
        deadline = time.monotonic() + 10
        while not all(_in_own_netns(holder.pid) for holder in holders):
            if time.monotonic() > deadline:
                raise RuntimeError("unshare --net did not start a namespace holder (is this root?)")
            time.sleep(0.01)
        gatekeeper = service.gatekeeper()
        policy = NetworkPolicy.offline()

        def episode(index: int) -> None:
            for offset, phase in ((0, Phase.AGENT), (1, Phase.VERIFIER)):
                gatekeeper.apply(paths[(index + offset) % 2], policy, phase, read_file=_nothing, write_file=_ignore)
                gatekeeper.detach()
            gatekeeper.log()

        for index in range(20):
            episode(index)
        before, kernel_before = _cpu_s(), kernel_threads_s()
        for index in range(repetitions):
            episode(index)
        cpu_s, kernel_s = _cpu_s() - before, kernel_threads_s() - kernel_before
    finally:
        service.close()
        for holder in holders:
            holder.kill()
            holder.wait()
    gates = 2 * repetitions
    return {NAME: {"us_per_op": 1e6 * cpu_s / gates, "kernel_threads_us_per_op": 1e6 * kernel_s / gates}}


def _in_own_netns(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    except OSError:
        return False


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _nothing(path: str) -> bytes | None:
    return None


def _ignore(path: str, data: bytes) -> None:
    return None


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]))))
