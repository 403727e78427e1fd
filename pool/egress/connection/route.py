"""From a requested ``host:port`` to an open connection: resolve, refuse or allow, connect.

The proxy resolves names itself (the sandbox has no DNS) and judges every
address it would connect to, so a name that resolves to a private address is
refused like the literal. A name no rule of the policy can allow is refused
before any lookup: under ``no-network`` or a names-only allowlist, a lookup of
``<secret>.attacker.example`` would leak the secret to the attacker's DNS
server without a single packet reaching it.
"""

from __future__ import annotations

import asyncio
import base64
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from pool.egress.addresses import refusal
from pool.egress.connection.attempt import Attempt
from pool.egress.connection.head import Authority
from pool.egress.limits import ProxyLimits
from pool.egress.settings import EgressSettings
from pool.network.policy import Decision, IPAddress, NetworkMode, NetworkPolicy, parse_address

if TYPE_CHECKING:
    from pool.egress.cache.downloads import DownloadCache

MAX_ADDRESSES = 4
"""How many of a name's permitted addresses are tried before it counts as unreachable."""


class Refused(Exception):
    """The destination may not be reached; ``rule`` says which rule refused it."""

    def __init__(self, rule: str, address: IPAddress | None = None) -> None:
        super().__init__(rule)
        self.rule = rule
        self.address = address


class Unreachable(Exception):
    """The destination was allowed but could not be reached; ``error`` says why."""

    def __init__(self, error: str, rule: str = "") -> None:
        super().__init__(error)
        self.error = error
        self.rule = rule
        """The policy rule that allowed the destination."""


@dataclass(frozen=True, slots=True)
class Network:
    """What the connections of one gate share."""

    settings: EgressSettings
    limits: ProxyLimits
    lookups: asyncio.Semaphore
    """The gate's DNS lookups in flight (each holds a resolver thread until it returns)."""
    cache: DownloadCache | None = None
    """The proxy's download cache, while caching is on (:mod:`pool.egress.cache`)."""


@dataclass(frozen=True, slots=True)
class Route:
    """An open connection to a destination, directly or through the upstream proxy."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    rule: str
    """The policy rule that allowed it."""
    upstream_target: str | None = None
    """For a plain HTTP request through the upstream proxy: the ``host:port`` to put in its URL."""


async def open_route(
    target: Authority, policy: NetworkPolicy, network: Network, attempt: Attempt, *, tunnel: bool
) -> Route:
    """Connect to ``target`` if ``policy`` and the machine's rules allow it.

    Sets ``attempt.address`` to the address tried (or refused). Through an upstream proxy,
    ``tunnel`` asks it for a CONNECT tunnel; otherwise the caller sends it an absolute URL.

    Raises:
        Refused: a rule refuses the destination.
        Unreachable: it is allowed but no connection could be made.
    """
    settings = network.settings
    if rule := refusal(None, target.port, settings):
        raise Refused(rule)
    try:
        addresses = await _addresses(target, policy, network)
    except Unreachable as exc:
        exc.rule = policy.decide(target.host, target.port, None).rule
        raise
    if addresses is None:  # the upstream proxy resolves the name
        return await _connect(target, policy.decide(target.host, target.port, None), network, tunnel)
    last = Unreachable("no address")
    for address, decision in _permitted(target, addresses, policy, settings)[:MAX_ADDRESSES]:
        attempt.address = str(address)
        try:
            return await _connect(Authority(str(address), target.port), decision, network, tunnel)
        except Unreachable as exc:
            last = exc
    raise last


def permit_offline(target: Authority, policy: NetworkPolicy, network: Network, attempt: Attempt) -> str:
    """The rule that allows ``target`` without connecting anywhere (a replay); no name is looked up.

    The same rules as :func:`open_route` hold, on what is known without DNS: an address literal,
    or the ``hosts`` map's address, is judged like a resolved one; any other name by name alone.

    Raises:
        Refused: a rule refuses the destination.
    """
    settings = network.settings
    if rule := refusal(None, target.port, settings):
        raise Refused(rule)
    address = parse_address(target.host) or settings.host_addresses.get(target.host)
    if address is None:
        if target.host == "localhost" or target.host.endswith(".localhost"):
            raise Refused("non-global name localhost")
        decision = policy.decide(target.host, target.port, None)
        if not decision.allowed:
            raise Refused(decision.rule)
        return decision.rule
    attempt.address = str(address)
    return _permitted(target, [address], policy, settings)[0][1].rule


async def _connect(via: Authority, decision: Decision, network: Network, tunnel: bool) -> Route:
    # via: the checked address, or (through an upstream proxy that resolves it) the name.
    try:
        if network.settings.upstream is not None:
            return await _upstream(str(via), decision.rule, network, tunnel=tunnel)
        reader, writer = await _dial(via.host, via.port, network, "")
        return Route(reader, writer, decision.rule)
    except Unreachable as exc:
        exc.rule = decision.rule
        raise


def upstream_authorization(settings: EgressSettings) -> str | None:
    """The ``Proxy-Authorization`` value for the upstream proxy, when its URL has credentials."""
    if settings.upstream_proxy is None:
        return None
    parts = urlsplit(settings.upstream_proxy)
    if parts.username is None:
        return None
    secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    return "Basic " + base64.b64encode(secret).decode()


async def _addresses(target: Authority, policy: NetworkPolicy, network: Network) -> list[IPAddress] | None:
    literal = parse_address(target.host)
    if literal is not None:
        return [literal]
    mapped = network.settings.host_addresses.get(target.host)
    if mapped is not None:
        return [mapped]
    if target.host == "localhost" or target.host.endswith(".localhost"):
        raise Refused("non-global name localhost")  # RFC 6761: this machine, wherever resolved
    named = policy.decide(target.host, target.port, None)
    if not named.allowed and (network.settings.upstream is not None or not _has_address_rules(policy)):
        raise Refused(named.rule)
    if network.settings.upstream is not None:
        return None
    return await _resolve(target, network)


def _lookup_over(lookup: asyncio.Future[Any], lookups: asyncio.Semaphore) -> None:
    lookups.release()
    if not lookup.cancelled():
        lookup.exception()  # retrieved: a lookup given up on must not log "never retrieved"


def _has_address_rules(policy: NetworkPolicy) -> bool:
    return policy.mode is NetworkMode.ALLOWLIST and any(rule.network is not None for rule in policy.rules)


async def _resolve(target: Authority, network: Network) -> list[IPAddress]:
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(network.settings.connect_timeout_s):
            await network.lookups.acquire()
            lookup = loop.run_in_executor(
                None, socket.getaddrinfo, target.host, target.port, 0, socket.SOCK_STREAM, socket.IPPROTO_TCP
            )
            # The slot is freed when the resolver thread is, not when this wait gives up.
            lookup.add_done_callback(lambda done: _lookup_over(done, network.lookups))
            infos = await asyncio.shield(lookup)
    except socket.gaierror:
        raise Unreachable("name does not resolve") from None
    except TimeoutError:
        raise Unreachable("name lookup timed out") from None
    found: list[IPAddress] = []
    for info in infos:
        address = parse_address(str(info[4][0]))
        if address is not None and address not in found:
            found.append(address)
    if not found:
        raise Unreachable("name does not resolve")
    return found


def _permitted(
    target: Authority, addresses: list[IPAddress], policy: NetworkPolicy, settings: EgressSettings
) -> list[tuple[IPAddress, Decision]]:
    refusals = [(a, refusal(a, target.port, settings)) for a in addresses]
    eligible = [a for a, rule in refusals if rule is None]
    if not eligible:
        address, rule = refusals[0]
        raise Refused(str(rule), address)
    decisions = [(a, policy.decide(target.host, target.port, a)) for a in eligible]
    permitted = [(a, d) for a, d in decisions if d.allowed]
    if not permitted:
        raise Refused(decisions[0][1].rule, decisions[0][0])
    return permitted


async def _dial(host: str, port: int, network: Network, what: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        async with asyncio.timeout(network.settings.connect_timeout_s):
            return await asyncio.open_connection(host, port, limit=network.limits.max_head_bytes)
    except TimeoutError:
        raise Unreachable(f"{what}timed out") from None
    except ConnectionRefusedError:
        raise Unreachable(f"{what}connection refused") from None
    except OSError as exc:
        raise Unreachable(f"{what}{(exc.strerror or type(exc).__name__).lower()}") from None


async def _upstream(target: str, rule: str, network: Network, *, tunnel: bool) -> Route:
    settings = network.settings
    assert settings.upstream is not None
    reader, writer = await _dial(*settings.upstream, network, "upstream proxy: ")
    if not tunnel:
        return Route(reader, writer, rule, upstream_target=target)
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
    if (authorization := upstream_authorization(settings)) is not None:
        lines.append(f"Proxy-Authorization: {authorization}")
    try:
        async with asyncio.timeout(settings.connect_timeout_s):
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
            await writer.drain()
            status = _status(await reader.readuntil(b"\r\n\r\n"))
    except (OSError, TimeoutError, EOFError, asyncio.LimitOverrunError) as exc:
        writer.transport.abort()
        raise Unreachable(f"upstream proxy: no answer to CONNECT ({type(exc).__name__})") from None
    if not 200 <= status < 300:
        writer.transport.abort()
        raise Unreachable(f"upstream proxy answered {status}")
    return Route(reader, writer, rule)


def _status(head: bytes) -> int:
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        return 0
    return int(parts[1])
