"""Destinations the egress proxy refuses whatever a task's policy says.

A sandbox must never reach the machine it runs on, the cluster around it or a
cloud's metadata service, even under ``public``: every address that is not
global (loopback, private, link-local with ``169.254.169.254``, CGNAT, ULA,
multicast, unspecified, reserved) is refused unless an operator trusted its
network (:attr:`EgressSettings.trusted_networks`), and Ray's ports are refused
on every address. So is every address of this machine's own interfaces (a
cloud VM's public address reaches the same services as its loopback). The
check runs on each address the proxy would connect to, after it resolved the
name itself, so a name that resolves to a private address (DNS rebinding) is
refused like the literal.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import time
from pathlib import Path

from pool.egress.settings import EgressSettings
from pool.network.policy import IPAddress


def refusal(address: IPAddress | None, port: int, settings: EgressSettings) -> str | None:
    """Why ``address:port`` may not be reached whatever the policy, or None when it may.

    Args:
        address: where the proxy would connect; None when an upstream proxy resolves the
            name (then only the port is checked).
        port: the destination port.
        settings: the machine's egress settings (trusted networks, denied ports).

    Returns:
        A short rule for the audit and the refusal message (``"denied port 6379"``,
        ``"non-global address 10.0.0.3"``), or None.
    """
    if port in settings.denied_ports:
        return f"denied port {port}"
    if address is None:
        return None
    address = _unwrapped(address)
    if _trusted(address, settings):
        return None
    if address in host_addresses():
        return f"this machine's address {address}"
    if is_global(address):
        return None
    return f"non-global address {address}"


_HOST_ADDRESSES_TTL_S = 30.0
_host_addresses: tuple[float, frozenset[IPAddress]] = (-_HOST_ADDRESSES_TTL_S, frozenset())


def host_addresses() -> frozenset[IPAddress]:
    """The addresses of this machine's interfaces (read from /proc, refreshed every 30 s)."""
    global _host_addresses
    read_at, addresses = _host_addresses
    if time.monotonic() - read_at < _HOST_ADDRESSES_TTL_S:
        return addresses
    found: set[IPAddress] = set()
    with contextlib.suppress(OSError):  # IPv4: the LOCAL routes of the local table
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
        for previous, line in itertools.pairwise(lines):
            if line.strip() == "/32 host LOCAL":
                with contextlib.suppress(ValueError):
                    found.add(ipaddress.IPv4Address(previous.strip().split()[-1]))
    with contextlib.suppress(OSError):  # IPv6: one address per line, 32 hex digits first
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            with contextlib.suppress(ValueError, IndexError):
                found.add(ipaddress.IPv6Address(int(line.split()[0], 16)))
    _host_addresses = (time.monotonic(), frozenset(found))
    return _host_addresses[1]


def is_global(address: IPAddress) -> bool:
    """Whether ``address`` is on the public internet: ``ipaddress``'s ``is_global``, and also
    not multicast, IPv6 site-local or IPv4-compatible, with IPv4 embedded in IPv6 (mapped, 6to4, NAT64) judged
    as the IPv4 address it reaches."""
    address = _unwrapped(address)
    if address.is_multicast:
        return False  # ipaddress (3.11) calls 224.0.0.0/4 global
    if isinstance(address, ipaddress.IPv6Address):
        if address.is_site_local or address in _NAT64_LOCAL or address in _V4_COMPATIBLE:
            return False
        if address.sixtofour is not None:
            return is_global(address.sixtofour)
        if address in _NAT64:
            return is_global(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return address.is_global


_V4_COMPATIBLE = ipaddress.IPv6Network("::/96")
"""Deprecated IPv4-compatible addresses (``::10.0.0.3``): tunnels may still carry them to IPv4."""
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
"""The well-known NAT64 prefix: a NAT64 gateway turns 64:ff9b::a00:3 into 10.0.0.3."""
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
"""Local-use NAT64 prefixes (RFC 8215): what they reach is the site's business, never global."""


def _unwrapped(address: IPAddress) -> IPAddress:
    # ::ffff:10.0.0.3 reaches 10.0.0.3; judge it as that, not as an IPv6 address.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted(address: IPAddress, settings: EgressSettings) -> bool:
    return any(address.version == network.version and address in network for network in settings.networks)
