"""One sandbox's way out, for backends whose sandboxes run on this machine.

The backend says where the sandbox's current network namespace is; the
gatekeeper keeps one gate of the process's :class:`~pool.egress.proxy.EgressProxy`
listening in it at ``127.0.0.1:3128`` with the phase's policy, moves it when
the namespace changes (a restore or a strict verifier starts a new one), and
keeps the records of closed gates until they are read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pool.egress.audit import NetworkLog
from pool.egress.netns import listen_in_netns
from pool.egress.policy import NetworkPolicy, Phase
from pool.egress.sandboxside import PROXY_PORT, ca_bundle, proxy_environment

if TYPE_CHECKING:
    from pool.egress.proxy import EgressProxy, Gate

SETTLE_S = 0.5
"""How long :meth:`Gatekeeper.log` waits for open connections to end before reading the records."""
WriteFile = Callable[[str, bytes], None]
ReadFile = Callable[[str], bytes | None]


class Gatekeeper:
    """The egress of one sandbox: attach with :meth:`apply`, read with :meth:`log`."""

    def __init__(self, proxy: Callable[[], EgressProxy]) -> None:
        self._proxy = proxy
        self._gate: Gate | None = None
        self._netns: tuple[int, int] | None = None
        self._log = NetworkLog()
        self.environment: dict[str, str] = {}
        """The variables every command of the sandbox gets while a gate is attached."""

    def apply(
        self, netns_path: str, policy: NetworkPolicy, phase: Phase, *, read_file: ReadFile, write_file: WriteFile
    ) -> dict[str, str]:
        """Give the namespace at ``netns_path`` the policy of ``phase``; returns the commands' variables."""
        stat = os.stat(netns_path)
        here = (stat.st_dev, stat.st_ino)
        if self._gate is not None and self._netns == here:
            self._gate.set_policy(policy, phase)
            return dict(self.environment)
        self.detach()
        proxy = self._proxy()
        listener = listen_in_netns(netns_path, PROXY_PORT)
        self._gate = proxy.open_gate(listener, policy, phase)
        self._netns = here
        bundle = ca_bundle(proxy.sandbox_ca_files, read_file=read_file, write_file=write_file)
        self.environment = proxy_environment(bundle)
        return dict(self.environment)

    def seal(self) -> None:
        """Cut what is open and refuse everything until the next :meth:`apply` (the agent's turn ended)."""
        if self._gate is not None:
            self._gate.set_policy(NetworkPolicy.offline(), Phase.VERIFIER)

    def detach(self) -> None:
        """Close the gate (its open connections are cut), keeping its records for :meth:`log`."""
        gate, self._gate, self._netns = self._gate, None, None
        self.environment = {}
        if gate is not None:
            self._collect(gate)
            gate.close()
            self._collect(gate)

    def log(self) -> NetworkLog:
        """The attempts since the last call, the attached gate's included.

        A connection's record is written when the proxy has finished with it, a moment after its
        client hung up: connections still open are given up to :data:`SETTLE_S` to end, so a
        request that just completed is in the log. One still open after that (a live process's)
        is recorded when it ends, in a later log, or is cut with the gate at the next restore.
        """
        if self._gate is not None:
            deadline = time.monotonic() + SETTLE_S
            while self._gate.open_connections and time.monotonic() < deadline:
                time.sleep(0.002)
            self._collect(self._gate)
        log, self._log = self._log, NetworkLog()
        return log

    def _collect(self, gate: Gate) -> None:
        records, dropped = gate.drain()
        self._log = self._log + NetworkLog(tuple(records), dropped)
