"""One sandbox's way out, for backends whose sandboxes run on this machine.

The backend says where the sandbox's current network namespace is; the
gatekeeper keeps one gate of the process's :class:`~pool.egress.proxy.EgressProxy`
listening in it at ``127.0.0.1:3128`` with the phase's policy (and, during the
agent's turn, a model gate per configured model route: :mod:`pool.egress.models.routes`), moves it when
the namespace changes (a restore or a strict verifier starts a new one), and
keeps the records of closed gates until they are read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pool.egress.onhost.netns import listen_in_netns
from pool.egress.sandboxside import PROXY_PORT, ca_bundle, proxy_environment
from pool.network.audit import NetworkLog
from pool.network.policy import NetworkPolicy, Phase

if TYPE_CHECKING:
    from pool.egress.models.gateway import ModelGate
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
        self._proxy_environment: dict[str, str] = {}
        self._model_gates: list[ModelGate] = []
        self._log = NetworkLog()
        self.environment: dict[str, str] = {}
        """The variables every command of the sandbox gets while a gate is attached."""

    def apply(
        self, netns_path: str, policy: NetworkPolicy, phase: Phase, *, read_file: ReadFile, write_file: WriteFile
    ) -> dict[str, str]:
        """Give the namespace at ``netns_path`` the policy of ``phase`` (and, in the agent's phase,
        the configured model routes); returns the commands' variables.

        Raises:
            ConfigError: a model route's key is not set in this process.
        """
        stat = os.stat(netns_path)
        here = (stat.st_dev, stat.st_ino)
        if self._gate is not None and self._netns == here:
            self._gate.set_policy(policy, phase)
        else:
            self.detach()
            proxy = self._proxy()
            listener = listen_in_netns(netns_path, PROXY_PORT)
            self._gate = proxy.open_gate(listener, policy, phase)
            self._netns = here
            bundle = ca_bundle(proxy.sandbox_ca_files, read_file=read_file, write_file=write_file)
            self._proxy_environment = proxy_environment(bundle)
        if phase is Phase.AGENT:
            self._open_model_gates(netns_path)
        else:
            self._close_model_gates()
        models = {k: v for gate in self._model_gates for k, v in gate.route.environment.items()}
        self.environment = {**self._proxy_environment, **models}
        return dict(self.environment)

    def seal(self) -> None:
        """Cut what is open and refuse everything until the next :meth:`apply` (the agent's turn ended)."""
        self._close_model_gates()
        if self._gate is not None:
            self._gate.set_policy(NetworkPolicy.offline(), Phase.VERIFIER)

    def detach(self) -> None:
        """Close the gate (its open connections are cut), keeping its records for :meth:`log`."""
        self._close_model_gates()
        gate, self._gate, self._netns = self._gate, None, None
        self.environment, self._proxy_environment = {}, {}
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
        for model_gate in self._model_gates:
            self._collect_calls(model_gate)
        log, self._log = self._log, NetworkLog()
        return log

    def _collect(self, gate: Gate) -> None:
        records, dropped = gate.drain()
        self._log = self._log + NetworkLog(tuple(records), dropped)

    def _open_model_gates(self, netns_path: str) -> None:
        """Serve every configured model route in the namespace, unless that is done already."""
        proxy = self._proxy()
        if self._model_gates or not proxy.settings.models:
            return
        try:
            for route in proxy.settings.models:
                listener = listen_in_netns(netns_path, route.port)
                self._model_gates.append(proxy.open_model_gate(listener, route))
        except BaseException:
            self._close_model_gates()
            raise

    def _close_model_gates(self) -> None:
        gates, self._model_gates = self._model_gates, []
        for gate in gates:
            self._proxy().close_model_gate(gate)
            self._collect_calls(gate)
        self.environment = dict(self._proxy_environment)

    def _collect_calls(self, gate: ModelGate) -> None:
        calls, dropped = gate.drain()
        if calls or dropped:
            self._log = self._log + NetworkLog((), dropped, tuple(calls))
