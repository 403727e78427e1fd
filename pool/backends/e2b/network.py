"""snapgym's network policies on E2B's own egress controls (``Sandbox.update_network``).

E2B filters a sandbox's outbound traffic by destination (``allow_out`` and
``deny_out``: CIDRs, addresses and host names), at its network edge. Each
policy becomes one atomic update:

``no-network``
    ``deny_out: [0.0.0.0/0]`` (every sandbox is also created with
    ``allow_internet_access=False``, so a sandbox starts with nothing).
``public``
    Everything except what snapgym's own proxy refuses whatever the policy:
    loopback, private, link-local (the metadata address), CGNAT and
    multicast ranges go in ``deny_out``.
``allowlist``
    The hosts in ``allow_out``, everything else denied. E2B matches names and
    addresses, not ports, so an entry with ``:PORT`` is refused rather than
    silently widened to every port.

What E2B does not give: a record of the attempts (``Capabilities.egress_audit``
is False), SNI checks against the requested host, or the download cache.
"""

from __future__ import annotations

from typing import Any

from pool.backends.remote.egress import EVERYTHING, NON_GLOBAL, destination, refuse_ports
from pool.network.policy import NetworkMode, NetworkPolicy


def provider_network(policy: NetworkPolicy) -> dict[str, Any]:
    """The ``update_network`` body that enforces ``policy``.

    Raises:
        UnsupportedError: an allowlist entry with a port (E2B filters by destination only).
    """
    if policy.mode is NetworkMode.NO_NETWORK:
        return {"deny_out": [EVERYTHING]}
    if policy.mode is NetworkMode.PUBLIC:
        return {"deny_out": list(NON_GLOBAL)}
    refuse_ports(policy, "E2B")
    return {"allow_out": [destination(rule) for rule in policy.rules], "deny_out": [EVERYTHING]}
