"""Serving one client connection of the egress proxy: read the request, judge it, relay it.

A connection carries one request: ``CONNECT host:port`` opens a tunnel, an
absolute-form request (``GET http://host/path``) is forwarded in origin form
with ``Connection: close``. While the download cache is on, both are served by
:mod:`pool.egress.connection.cached` once judged. Whatever happens is written into the connection's
:class:`Attempt`; the caller turns it into the audit record and closes the
client connection.
"""

from __future__ import annotations

import asyncio
import functools

from pool.egress.connection import cached
from pool.egress.connection.attempt import Attempt
from pool.egress.connection.body import AnswerFraming, Framing, copy_body, framing
from pool.egress.connection.client import Client
from pool.egress.connection.head import Authority, RequestHead, host_of, parse_authority, parse_head, parse_proxy_url
from pool.egress.connection.relay import Activity, close, send
from pool.egress.connection.route import Network, Route, upstream_authorization
from pool.egress.connection.steps import established, open_destination, refuse, relay_route, relay_tunnel
from pool.network.audit import ALLOWED, INVALID
from pool.network.policy import NetworkPolicy

MAX_URL_CHARS = 512
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "upgrade"})
"""Headers meant for the proxy or this one connection: never forwarded (Proxy-Authorization
would hand the sandbox's proxy credentials to the destination)."""


class _Invalid(Exception):
    """The client did not send a proxy request we can serve (``answer``: tell it so)."""

    def __init__(self, why: str, *, answer: bool = True) -> None:
        super().__init__(why)
        self.answer = answer


async def serve(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    attempt: Attempt,
    policy: NetworkPolicy,
    network: Network,
) -> None:
    """Serve the one request of a client connection, recording it in ``attempt``."""
    client = Client(reader, writer, attempt, policy, network)
    try:
        head = await _read_head(client)
        attempt.kind = "connect" if head.method == "CONNECT" else "http"
        if head.method == "CONNECT":
            await _tunnel(client, head)
        else:
            await _forward(client, head)
    except _Invalid as exc:
        attempt.decided(INVALID, "invalid request", str(exc))
        if exc.answer:
            await client.reply(400, f"snapgym egress: not a proxy request ({attempt.error})")


async def _read_head(client: Client) -> RequestHead:
    limits = client.network.limits
    try:
        async with asyncio.timeout(limits.head_timeout_s):
            data = await client.reader.readuntil(b"\r\n\r\n")
        return parse_head(data)
    except TimeoutError:
        raise _Invalid("the request head did not arrive in time") from None
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise _Invalid("closed before sending a request", answer=False) from None
        raise _Invalid("closed inside the request head", answer=False) from None
    except asyncio.LimitOverrunError:
        raise _Invalid(f"request head over {limits.max_head_bytes} bytes") from None
    except ValueError as exc:
        raise _Invalid(str(exc)) from None


async def _tunnel(client: Client, head: RequestHead) -> None:
    try:
        target = parse_authority(head.target)
    except ValueError as exc:
        raise _Invalid(str(exc)) from None
    client.attempt.host, client.attempt.port = target.host, target.port
    if client.network.cache is not None:
        await cached.tunnel(client, target)
        return
    route = await open_destination(client, target, tunnel=True)
    if route is None:
        return
    try:
        if await established(client, route.rule):
            await relay_tunnel(client, route, target)
    finally:
        close(route.writer)


async def _forward(client: Client, head: RequestHead) -> None:
    attempt = client.attempt
    try:
        target, path = parse_proxy_url(head.target)
        body = framing(head)
        hosts = [host_of(value) for value in head.values("Host")]
    except ValueError as exc:
        raise _Invalid(str(exc)) from None
    attempt.host, attempt.port = target.host, target.port
    attempt.url = f"{head.method} {head.target}"[:MAX_URL_CHARS]
    if len(hosts) > 1:
        raise _Invalid("several Host headers")
    if hosts and hosts[0] != target.host:
        await refuse(client, target, f"host-mismatch: {hosts[0]}")
        return
    if client.network.cache is not None:
        await cached.forward(client, head, target)
        return
    route = await open_destination(client, target, tunnel=False)
    if route is None:
        return
    try:
        request = _origin_request(head, target, path, route, client.network)
        attempt.decided(ALLOWED, route.rule)
        answer = AnswerFraming(head.method, client.network.limits.max_head_bytes)
        await relay_route(client, route, functools.partial(_forward_up, client, request, body, route), answer)
    finally:
        close(route.writer)


async def _forward_up(client: Client, request: bytes, body: Framing, route: Route, activity: Activity) -> bool:
    await send(route.writer, request, activity)
    client.attempt.up(len(request))
    try:
        await copy_body(body, client.reader, route.writer, client.attempt.up, activity)
    except (ValueError, EOFError, asyncio.LimitOverrunError):
        client.attempt.error = "malformed or incomplete request body"
        return False
    return True  # the request is whole: wait for the answer, read nothing more from the client


def _origin_request(head: RequestHead, target: Authority, path: str, route: Route, network: Network) -> bytes:
    headers = [(name, value) for name, value in head.headers if name.lower() not in _HOP_BY_HOP]
    if not head.values("Host"):
        host = f"[{target.host}]" if ":" in target.host else target.host
        headers.insert(0, ("Host", host if target.port == 80 else f"{host}:{target.port}"))
    headers.append(("Connection", "close"))
    if route.upstream_target is None:
        return head.render(path, headers)
    if (authorization := upstream_authorization(network.settings)) is not None:
        headers.append(("Proxy-Authorization", authorization))
    return head.render(f"http://{route.upstream_target}{path}", headers)
