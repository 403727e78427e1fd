"""What the cloud backends' egress mappings share: which destinations a ``public`` policy still refuses,
and the allowlist entries a provider that filters by destination alone cannot express."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from pool.errors import UnsupportedError
from pool.network.policy import HostRule, NetworkPolicy

EVERYTHING = "0.0.0.0/0"
NON_GLOBAL = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
)  # fmt: skip
"""IPv4 ranges a ``public`` policy still refuses (the egress proxy's rule: loopback, private,
link-local with the metadata address, CGNAT, benchmarking, multicast and reserved)."""


def global_ranges() -> tuple[str, ...]:
    """IPv4 without :data:`NON_GLOBAL`, as the fewest CIDRs (for providers that only allow)."""
    remaining = [ipaddress.IPv4Network(EVERYTHING)]
    for excluded in map(ipaddress.IPv4Network, NON_GLOBAL):
        remaining = [part for network in remaining for part in _without(network, excluded)]
    return tuple(str(network) for network in ipaddress.collapse_addresses(remaining))


def _without(network: ipaddress.IPv4Network, excluded: ipaddress.IPv4Network) -> Iterator[ipaddress.IPv4Network]:
    if not network.overlaps(excluded):
        yield network
    elif not excluded.supernet_of(network):
        yield from network.address_exclude(excluded)


def refuse_ports(policy: NetworkPolicy, provider: str) -> None:
    """Refuse allowlist entries with a port: ``provider`` filters by destination, and allowing every
    port of the host would widen the policy silently.

    Raises:
        UnsupportedError: naming the entries.
    """
    with_port = [rule.text for rule in policy.rules if rule.port is not None]
    if with_port:
        raise UnsupportedError(
            f"{provider} filters egress by destination, not port: allow {', '.join(with_port)} without the port, "
            "or run the task on a backend with snapgym's egress proxy (local, docker)"
        )


def destination(rule: HostRule) -> str:
    """An allowlist entry as providers name it: a CIDR, a name, or ``*.name`` for a wildcard."""
    if rule.network is not None:
        return str(rule.network)
    return f"*.{rule.name}" if rule.wildcard else str(rule.name)


def destinations(policy: NetworkPolicy) -> tuple[list[str], list[str]]:
    """An allowlist's (networks as CIDRs, names), each in the policy's order."""
    networks = [destination(rule) for rule in policy.rules if rule.network is not None]
    names = [destination(rule) for rule in policy.rules if rule.network is None]
    return networks, names
