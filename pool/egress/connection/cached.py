"""Serving a connection while the download cache is on (:mod:`pool.egress.cache`).

The destination is judged exactly as without the cache (policy, addresses, a tunnel's first
bytes naming its host) before anything is fetched or served; then the HTTP(S) it carries is
handed to :mod:`pool.egress.cache.serving.intercept`. A replay connects nowhere, so it judges without
DNS (:func:`~pool.egress.connection.route.permit_offline`).
"""

from __future__ import annotations

import functools

from pool.egress.cache.serving import intercept
from pool.egress.connection import opening
from pool.egress.connection.client import Client
from pool.egress.connection.head import Authority, RequestHead
from pool.egress.connection.relay import close
from pool.egress.connection.route import Refused, Route, permit_offline, upstream_authorization
from pool.egress.connection.steps import checked_opening, established, open_destination, refuse, relay_tunnel
from pool.network.audit import ALLOWED, DENIED


async def tunnel(client: Client, target: Authority) -> None:
    """A tunnel while caching is on: judged as ever, then its HTTP(S) served by the cache."""
    route, rule = await _judge(client, target, tunnel=True)
    if rule is None:
        return
    try:
        if not await established(client, rule):
            return
        data = await checked_opening(client, target)
        if not data:
            return
        found = opening.kind(data)
        if found in (opening.Kind.TLS, opening.Kind.HTTP):
            is_tls = found is opening.Kind.TLS
            context = _context(client, target, route, tunnel=True, tls=is_tls)
            await intercept.serve_tunnel(context, data, is_tls, client.reader, client.writer)
        elif route is None:
            client.attempt.decided(DENIED, "replay: the tunnel carries neither TLS nor HTTP")
        else:  # another protocol (ssh, ...): relayed as without the cache, and not recorded
            await relay_tunnel(client, route, target, data)
    finally:
        if route is not None:
            close(route.writer)


async def forward(client: Client, head: RequestHead, target: Authority) -> None:
    """A plain proxy request while caching is on: judged as ever, then served by the cache."""
    route, rule = await _judge(client, target, tunnel=False)
    if rule is None:
        return
    client.attempt.decided(ALLOWED, rule)
    try:
        context = _context(client, target, route, tunnel=False, tls=False)
        await intercept.serve_request(
            context, head.render(head.target, list(head.headers)), client.reader, client.writer
        )
    finally:
        if route is not None:
            close(route.writer)


async def _judge(client: Client, target: Authority, *, tunnel: bool) -> tuple[Route | None, str | None]:
    """While caching is on: the route (none in a replay, which connects nowhere) and the rule that
    allowed the destination; no rule when it was refused (and the client told so)."""
    cache = client.network.cache
    assert cache is not None
    if not cache.is_replay:
        route = await open_destination(client, target, tunnel=tunnel)
        return route, None if route is None else route.rule
    try:
        return None, permit_offline(target, client.policy, client.network, client.attempt)
    except Refused as exc:
        await refuse(client, target, exc.rule, address=exc.address)
        return None, None


def _context(client: Client, target: Authority, route: Route | None, *, tunnel: bool, tls: bool) -> intercept.Context:
    """What the cache serves the connection's requests with: the origin is ``route`` (none in a
    replay), dialled again the same way when a later request needs a new connection; a plain request
    through the upstream proxy carries the upstream's credentials (a tunnel sent them with its CONNECT)."""
    cache, limits = client.network.cache, client.network.limits
    assert cache is not None
    dial = functools.partial(client.dial, target, tunnel=tunnel)
    authorization = None if tunnel else upstream_authorization(client.network.settings)
    origin = intercept.origin_for(cache, target, route, dial, client.attempt, limits, tls=tls,
                                  proxy_authorization=authorization)  # fmt: skip
    return intercept.Context(cache, target, client.attempt, limits, origin)
