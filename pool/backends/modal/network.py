"""snapgym's network policies on Modal's egress controls.

Every Modal sandbox is created with ``block_network`` (the build's, when its
policy is ``public``, with the network). A phase's policy then replaces the
sandbox's outbound policy at run time (``_experimental_set_outbound_network_policy``,
Modal's only call for it, marked experimental in its SDK): an allowlist of
CIDRs and domain names. ``public`` allows every global IPv4 range (IPv4 minus
the ranges snapgym's egress proxy refuses: loopback, private, link-local with
the metadata address, CGNAT, multicast, reserved) and no names, so a name is
reached through its address; ``allowlist`` allows its addresses and CIDRs and
its names (``*.`` for wildcards); ``no-network`` after a wider policy is an
empty allowlist. Modal filters by destination, not port, so an entry with
``:PORT`` is refused rather than widened. Nothing records the attempts
(``Capabilities.egress_audit`` is False).
"""

from __future__ import annotations

from pool.backends.remote.egress import destinations, global_ranges, refuse_ports
from pool.network.policy import NetworkMode, NetworkPolicy


def outbound_policy(policy: NetworkPolicy) -> dict[str, list[str]]:
    """The arguments of ``_experimental_set_outbound_network_policy`` that enforce ``policy``.

    Raises:
        UnsupportedError: an allowlist entry with a port.
    """
    if policy.mode is NetworkMode.NO_NETWORK:
        return {"outbound_cidr_allowlist": [], "outbound_domain_allowlist": []}
    if policy.mode is NetworkMode.PUBLIC:
        return {"outbound_cidr_allowlist": list(global_ranges()), "outbound_domain_allowlist": []}
    refuse_ports(policy, "Modal")
    networks, names = destinations(policy)
    return {"outbound_cidr_allowlist": networks, "outbound_domain_allowlist": names}
