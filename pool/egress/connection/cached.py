"""Serving a connection while the download cache is on (:mod:`pool.egress.cache`).

The destination is judged exactly as without the cache (policy, addresses, a tunnel's first
bytes naming its host) before anything is fetched or served; then the HTTP(S) it carries is
handed to :mod:`pool.egress.cache.intercept`. A replay connects nowhere, so it judges without
DNS (:func:`~pool.egress.connection.route.permit_offline`).
"""

from __future__ import annotations

import asyncio
import functools

from pool.egress.cache import intercept
from pool.egress.connection import opening
from pool.egress.connection.attempt import Attempt
from pool.egress.connection.head import Authority, RequestHead
from pool.egress.connection.relay import close
from pool.egress.connection.route import Network, Refused, Route, open_route, permit_offline, upstream_authorization
from pool.egress.connection.steps import checked_opening, established, open_destination, refuse, relay_tunnel
from pool.network.audit import ALLOWED, DENIED
from pool.network.policy import NetworkPolicy


async def tunnel(
    target: Authority,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    attempt: Attempt,
    policy: NetworkPolicy,
    network: Network,
) -> None:
    """A tunnel while caching is on: judged as ever, then its HTTP(S) served by the cache."""
    assert network.cache is not None
    route, rule = await _judge(target, writer, attempt, policy, network, tunnel=True)
    if rule is None:
        return
    try:
        if not await established(writer, attempt, rule, network):
            return
        data = await checked_opening(reader, target, attempt, network)
        if not data:
            return
        found = opening.kind(data)
        if found in (opening.Kind.TLS, opening.Kind.HTTP):
            dial = functools.partial(open_route, target, policy, network, attempt, tunnel=True)
            origin = intercept.origin_for(network.cache, target, route, dial, attempt, network.limits,
                                          tls=found is opening.Kind.TLS)  # fmt: skip
            context = intercept.Context(network.cache, target, attempt, network.limits, origin)
            await intercept.serve_tunnel(context, data, found is opening.Kind.TLS, reader, writer)
        elif route is None:
            attempt.decided(DENIED, "replay: the tunnel carries neither TLS nor HTTP")
        else:  # another protocol (ssh, ...): relayed as without the cache, and not recorded
            await relay_tunnel(reader, writer, route, target, attempt, network, data)
    finally:
        if route is not None:
            close(route.writer)


async def forward(
    head: RequestHead,
    target: Authority,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    attempt: Attempt,
    policy: NetworkPolicy,
    network: Network,
) -> None:
    """A plain proxy request while caching is on: judged as ever, then served by the cache."""
    assert network.cache is not None
    route, rule = await _judge(target, writer, attempt, policy, network, tunnel=False)
    if rule is None:
        return
    attempt.decided(ALLOWED, rule)
    try:
        dial = functools.partial(open_route, target, policy, network, attempt, tunnel=False)
        origin = intercept.origin_for(network.cache, target, route, dial, attempt, network.limits, tls=False,
                                      proxy_authorization=upstream_authorization(network.settings))  # fmt: skip
        context = intercept.Context(network.cache, target, attempt, network.limits, origin)
        await intercept.serve_request(context, head.render(head.target, list(head.headers)), reader, writer)
    finally:
        if route is not None:
            close(route.writer)


async def _judge(
    target: Authority,
    writer: asyncio.StreamWriter,
    attempt: Attempt,
    policy: NetworkPolicy,
    network: Network,
    *,
    tunnel: bool,
) -> tuple[Route | None, str | None]:
    """While caching is on: the route (none in a replay, which connects nowhere) and the rule that
    allowed the destination; no rule when it was refused (and the client told so)."""
    assert network.cache is not None
    if not network.cache.is_replay:
        route = await open_destination(target, writer, attempt, policy, network, tunnel=tunnel)
        return route, None if route is None else route.rule
    try:
        return None, permit_offline(target, policy, network, attempt)
    except Refused as exc:
        if exc.address is not None:
            attempt.address = str(exc.address)
        await refuse(writer, target, attempt, network, exc.rule)
        return None, None
