"""snapgym's network policies on Daytona's egress controls (``update_network_settings``).

``no-network`` blocks all outbound traffic; ``public`` lifts the block (Daytona
then allows every destination: the non-global ranges snapgym's proxy refuses
are not refused here, and ``Capabilities`` says so); ``allowlist`` allows its
IPv4 addresses and CIDRs (``network_allow_list``) and its names
(``domain_allow_list``) only. Daytona filters by destination, not port, so an
entry with ``:PORT`` is refused rather than widened; IPv6 entries likewise.
"""

from __future__ import annotations

from typing import Any

from pool.backends.remote.egress import destinations
from pool.errors import UnsupportedError
from pool.network.policy import NetworkMode, NetworkPolicy


def provider_network(policy: NetworkPolicy) -> dict[str, Any]:
    """The ``update_network_settings`` arguments that enforce ``policy``.

    Raises:
        UnsupportedError: an allowlist entry with a port, or an IPv6 one.
    """
    if policy.mode is NetworkMode.NO_NETWORK:
        return {"network_block_all": True}
    if policy.mode is NetworkMode.PUBLIC:
        return {"network_block_all": False}
    refused = [
        rule.text for rule in policy.rules if rule.port is not None or (rule.network and rule.network.version == 6)
    ]
    if refused:
        raise UnsupportedError(
            f"Daytona filters egress by IPv4 destination and name, not port or IPv6: {', '.join(refused)}; "
            "drop the port, or run the task on a backend with snapgym's egress proxy (local, docker)"
        )
    cidrs, names = destinations(policy)
    if not (cidrs or names):
        return {"network_block_all": True}
    settings: dict[str, Any] = {}  # an allow list implies the block (network_block_all=False would clear it)
    if cidrs:
        settings["network_allow_list"] = ",".join(cidrs)
    if names:
        settings["domain_allow_list"] = ",".join(names)
    return settings
