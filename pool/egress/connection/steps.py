"""Steps shared by the ways the egress proxy serves a connection: open or refuse a destination,
answer a CONNECT, check a tunnel's first bytes, relay a tunnel's bytes."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from pool.egress.connection import opening
from pool.egress.connection.body import AnswerFraming
from pool.egress.connection.client import Client
from pool.egress.connection.head import Authority
from pool.egress.connection.relay import Activity, SourceBrokenError, pipe, relay, send
from pool.egress.connection.route import Refused, Route, Unreachable
from pool.network.audit import ALLOWED, DENIED, UNREACHABLE
from pool.network.policy import IPAddress

_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


async def established(client: Client, rule: str) -> bool:
    """Answer a CONNECT with 200 and record the destination as allowed by ``rule``; False when
    the client did not take the answer in time."""
    try:
        async with asyncio.timeout(client.network.limits.reply_timeout_s):
            await send(client.writer, _ESTABLISHED)
    except TimeoutError:
        client.attempt.decided(ALLOWED, rule, "the client did not read the proxy's answer")
        return False
    client.attempt.decided(ALLOWED, rule)
    return True


async def relay_route(
    client: Client,
    route: Route,
    up: Callable[[Activity], Coroutine[Any, Any, bool]],
    answer: AnswerFraming | None = None,
) -> None:
    """Relay both ways until the connection is over (see :func:`~pool.egress.connection.relay.relay`):
    ``up(activity)`` sends the client's bytes to ``route``, the destination's answer goes back as it
    comes (followed by ``answer``, which tells whether it ended whole); an idle timeout or a cut
    transfer breaks the connection off (:meth:`~pool.egress.connection.attempt.Attempt.broke`)."""
    activity = Activity()
    down = _down(client, route, activity, answer)
    if (ended := await relay(up(activity), down, activity, client.network.limits.idle_timeout_s)) is not None:
        client.attempt.broke(ended)


async def _down(client: Client, route: Route, activity: Activity, answer: AnswerFraming | None) -> None:
    watch = None if answer is None else answer.feed
    await pipe(route.reader, client.writer, client.attempt.down, activity, watch)
    if answer is not None and (short := answer.shortfall()) is not None:
        raise SourceBrokenError(short)


async def relay_tunnel(client: Client, route: Route, target: Authority, checked: bytes | None = None) -> None:
    """Relay a tunnel's bytes both ways (its opening checked first, unless ``checked`` already was)."""
    await relay_route(client, route, functools.partial(_tunnel_up, client, route, target, checked=checked))


async def _tunnel_up(
    client: Client, route: Route, target: Authority, activity: Activity, *, checked: bytes | None
) -> bool:
    data = checked if checked is not None else await checked_opening(client, target)
    if data is None:
        return False
    if data:
        activity.touch()
        await send(route.writer, data, activity)
        client.attempt.up(len(data))
        await pipe(client.reader, route.writer, client.attempt.up, activity)
    if route.writer.can_write_eof():
        route.writer.write_eof()  # the client is done sending; the destination may still answer
    return True


async def checked_opening(client: Client, target: Authority) -> bytes | None:
    """The tunnel's first bytes, or None when they name another host or cannot be read (refused)."""
    attempt = client.attempt
    try:
        data = await opening.read_opening(client.reader, client.network.limits)
    except opening.Unreadable as exc:
        attempt.decided(DENIED, f"unreadable opening: {exc}")
        return None
    if data:
        attempt.sni, rule = opening.refusal(data, target)
        if rule is not None:
            attempt.decided(DENIED, rule)
            return None
    return data


async def open_destination(client: Client, target: Authority, *, tunnel: bool) -> Route | None:
    """Connect to ``target`` as :meth:`Client.dial` does; None when it was refused or unreachable
    (the client is told so, the attempt records why)."""
    try:
        return await client.dial(target, tunnel=tunnel)
    except Refused as exc:
        await refuse(client, target, exc.rule, address=exc.address)
    except Unreachable as exc:
        client.attempt.decided(UNREACHABLE, exc.rule, exc.error)
        await client.reply(502, f"snapgym egress: {target} unreachable: {exc.error}")
    return None


async def refuse(client: Client, target: Authority, rule: str, *, address: IPAddress | None = None) -> None:
    """Record ``target`` as denied by ``rule`` (at ``address``, when one was judged) and tell the
    client so (403)."""
    if address is not None:
        client.attempt.address = str(address)
    client.attempt.decided(DENIED, rule)
    await client.reply(403, f"snapgym egress: {target} refused in the {client.attempt.phase} phase ({rule})")
