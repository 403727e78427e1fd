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

from pool.egress.policy import NetworkMode, NetworkPolicy
from pool.errors import UnsupportedError

EVERYTHING = "0.0.0.0/0"
NON_GLOBAL = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
)  # fmt: skip
"""IPv4 ranges a ``public`` policy still refuses (the egress proxy's rule, for what E2B can express)."""


def provider_network(policy: NetworkPolicy) -> dict[str, Any]:
    """The ``update_network`` body that enforces ``policy``.

    Raises:
        UnsupportedError: an allowlist entry with a port (E2B filters by destination only).
    """
    if policy.mode is NetworkMode.NO_NETWORK:
        return {"deny_out": [EVERYTHING]}
    if policy.mode is NetworkMode.PUBLIC:
        return {"deny_out": list(NON_GLOBAL)}
    with_port = [rule.text for rule in policy.rules if rule.port is not None]
    if with_port:
        raise UnsupportedError(
            f"E2B filters egress by destination, not port: allow {', '.join(with_port)} without the port, "
            "or run the task on a backend with snapgym's egress proxy (local, docker)"
        )
    allowed = [
        str(rule.network) if rule.network is not None else f"*.{rule.name}" if rule.wildcard else str(rule.name)
        for rule in policy.rules
    ]
    return {"allow_out": allowed, "deny_out": [EVERYTHING]}
