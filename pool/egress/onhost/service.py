"""The egress proxy of one backend instance, started on first use, with what it lets the backend declare."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pool.capabilities import EgressControl
from pool.egress.onhost.gatekeeper import Gatekeeper
from pool.egress.settings import EgressSettings
from pool.network.policy import NetworkMode

if TYPE_CHECKING:
    from pool.egress.proxy import EgressProxy


class EgressService:
    """A backend's way to give its sandboxes network: one proxy, one gatekeeper per sandbox.

    Args:
        settings: the proxy's side of the network (an EgressSettings, or its fields as a mapping).
        available: False where the backend cannot put a proxy into its sandboxes (then they get
            loopback only, and only ``no-network`` policies are accepted); ``unavailable_reason``
            says why.
    """

    def __init__(
        self,
        settings: EgressSettings | Mapping[str, Any] | None,
        *,
        available: bool = True,
        unavailable_reason: str = "",
    ) -> None:
        self.settings = EgressSettings.parse(settings)
        self.available = available
        self.unavailable_reason = unavailable_reason
        self._proxy: EgressProxy | None = None
        self._lock = threading.Lock()

    @property
    def capability_fields(self) -> dict[str, Any]:
        """``egress_control``, ``network_modes`` and ``egress_audit`` for the backend's Capabilities."""
        if not self.available:
            return {
                "egress_control": EgressControl.LOOPBACK_ONLY,
                "network_modes": (NetworkMode.NO_NETWORK.value,),
                "build_network_modes": (NetworkMode.NO_NETWORK.value, NetworkMode.PUBLIC.value),
            }
        every = tuple(m.value for m in NetworkMode)
        return {
            "egress_control": EgressControl.PROXY,
            "network_modes": every,
            "build_network_modes": every,
            "egress_audit": True,
        }

    def gatekeeper(self) -> Gatekeeper:
        """A gatekeeper for one new sandbox."""
        return Gatekeeper(self.proxy)

    def proxy(self) -> EgressProxy:
        """The proxy, started on first use."""
        from pool.egress.proxy import EgressProxy

        with self._lock:
            if self._proxy is None:
                self._proxy = EgressProxy(self.settings)
            return self._proxy

    def close(self) -> None:
        """Stop the proxy (every gate closes). Idempotent."""
        with self._lock:
            proxy, self._proxy = self._proxy, None
        if proxy is not None:
            proxy.close()
