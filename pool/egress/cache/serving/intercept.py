"""Serving a client connection's HTTP requests through the download cache.

The proxy has already judged the connection (policy, addresses, the tunnel's first bytes);
here each request is read with h11, checked (it must name the judged host; no upgrades), and
answered from the store (:mod:`~pool.egress.cache.serving.replay`) or forwarded to the origin and stored
on the way back (:mod:`~pool.egress.cache.serving.record`). A tunnel carries as many requests as the
client sends; a plain proxy request carries one. The audit record of the connection says what
the cache did (:func:`~pool.egress.cache.serving.exchange.mark`): ``hit``, ``stored``, ``passed``
(forwarded, not stored) or ``miss``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable

import h11

from pool.egress.cache.downloads import DownloadCache
from pool.egress.cache.key import RequestKey, key_headers, origin_target
from pool.egress.cache.serving.exchange import ClientFailed, Context, answer
from pool.egress.cache.serving.record import record
from pool.egress.cache.serving.replay import replay
from pool.egress.cache.transport.http import Peer, text_headers, values
from pool.egress.cache.transport.origin import Origin, OriginSpec
from pool.egress.cache.transport.streams import PlainStream, Stream, TLSStream
from pool.egress.connection.attempt import Attempt
from pool.egress.connection.head import Authority, host_of, parse_authority
from pool.egress.connection.route import Route
from pool.egress.limits import ProxyLimits
from pool.network.audit import DENIED

__all__ = ["Context", "origin_for", "serve_request", "serve_tunnel"]


def origin_for(
    cache: DownloadCache,
    target: Authority,
    route: Route | None,
    dial: Callable[[], Awaitable[Route]],
    attempt: Attempt,
    limits: ProxyLimits,
    *,
    tls: bool,
    proxy_authorization: str | None = None,
) -> Origin | None:
    """The origin connection of a recording (None when replaying)."""
    if route is None:
        return None
    context = cache.origin_tls if tls else None
    spec = OriginSpec(target.host, context, limits.idle_timeout_s, limits.max_head_bytes, proxy_authorization)
    return Origin(spec, route, dial, attempt.up)


async def serve_tunnel(
    context: Context, opening: bytes, is_tls: bool, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Serve the requests of a CONNECT tunnel whose first bytes (``opening``) were checked."""
    attempt, timeout_s = context.attempt, context.limits.idle_timeout_s
    if not is_tls:
        await _serve(context, PlainStream(reader, writer, attempt.down, timeout_s, opening), "http", keep_alive=True)
        return
    server = context.cache.authority.server_context(context.target.host)
    stream = TLSStream(reader, writer, server, attempt.down, timeout_s, server_side=True, initial=opening)
    try:
        await stream.handshake()
    except (ssl.SSLError, OSError, TimeoutError) as exc:
        reason = exc.reason if isinstance(exc, ssl.SSLError) and exc.reason else type(exc).__name__
        attempt.error = f"TLS with the client failed ({reason}): does it trust the cache's CA?"
        return
    try:
        await _serve(context, stream, "https", keep_alive=True)
    finally:
        stream.close()


async def serve_request(
    context: Context, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Serve a plain proxy request whose head (``head``, already judged) was read from ``reader``."""
    stream = PlainStream(reader, writer, context.attempt.down, context.limits.idle_timeout_s, head)
    await _serve(context, stream, "http", keep_alive=False)


async def _serve(context: Context, stream: Stream, scheme: str, *, keep_alive: bool) -> None:
    client = Peer(h11.SERVER, stream, context.limits.max_head_bytes)
    try:
        while True:
            try:
                event = await client.next_event()
            except TimeoutError:
                context.attempt.error = "idle timeout"
                return
            if not isinstance(event, h11.Request):
                return  # the client closed between requests
            if not await _one(context, client, event, scheme, keep_alive) or not keep_alive or not client.reusable():
                return
    except (h11.RemoteProtocolError, ClientFailed) as exc:
        context.attempt.error = f"malformed or incomplete request: {exc}"
        await answer(context, client, 400, f"snapgym egress: malformed or incomplete request ({exc})")
    finally:
        if context.origin is not None:
            context.origin.close()


async def _one(context: Context, client: Peer, request: h11.Request, scheme: str, keep_alive: bool) -> bool:
    attempt = context.attempt
    headers = text_headers(request.headers)
    method, raw_target = request.method.decode("ascii"), request.target.decode("latin-1")
    problem = _problem(method, raw_target, headers, context.target)
    if problem is not None:
        status, why = problem
        if status == 403:
            attempt.decided(DENIED, why)
        else:
            attempt.error = why
        await answer(context, client, status, f"snapgym egress: {why}")
        return False
    key = RequestKey(method, scheme, context.target.host, context.target.port, origin_target(raw_target), None,
                     key_headers(headers))  # fmt: skip
    if attempt.url is None:
        attempt.url = f"{method} {key.url}"[:512]
    if client.h11.they_are_waiting_for_100_continue:
        await client.send(h11.InformationalResponse(status_code=100, headers=[]))
    close = [] if keep_alive else [("Connection", "close")]
    if context.origin is None:
        return await replay(context, client, key, close)
    return await record(context, context.origin, client, key, headers, close)


def _problem(method: str, target: str, headers: list[tuple[str, str]], judged: Authority) -> tuple[int, str] | None:
    if method == "CONNECT" or values(headers, "upgrade"):
        return 501, "the download cache serves plain HTTP/1.1 requests only (no CONNECT or Upgrade inside)"
    if values(headers, "transfer-encoding") and values(headers, "content-length"):
        return 400, "both Content-Length and Transfer-Encoding"
    try:
        named = [host_of(value) for value in values(headers, "host")]
        if "://" in target:
            named.append(parse_authority(target.split("://", 1)[1].split("/", 1)[0], default_port=0).host)
    except ValueError:
        return 403, "host-mismatch: unreadable host"
    for host in named:
        if host != judged.host:
            return 403, f"host-mismatch: {host}"
    return None
