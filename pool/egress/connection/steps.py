"""Steps shared by the ways the egress proxy serves a connection: open or refuse a destination,
answer a CONNECT, check a tunnel's first bytes, relay a tunnel's bytes."""

from __future__ import annotations

import asyncio

from pool.egress.connection import opening
from pool.egress.connection.attempt import Attempt
from pool.egress.connection.head import Authority
from pool.egress.connection.relay import Activity, pipe, relay, reply, send
from pool.egress.connection.route import Network, Refused, Route, Unreachable, open_route
from pool.network.audit import ALLOWED, DENIED, UNREACHABLE
from pool.network.policy import NetworkPolicy

_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


async def established(writer: asyncio.StreamWriter, attempt: Attempt, rule: str, network: Network) -> bool:
    """Answer a CONNECT with 200 and record the destination as allowed by ``rule``; False when
    the client did not take the answer in time."""
    try:
        async with asyncio.timeout(network.limits.reply_timeout_s):
            await send(writer, _ESTABLISHED)
    except TimeoutError:
        attempt.decided(ALLOWED, rule, "the client did not read the proxy's answer")
        return False
    attempt.decided(ALLOWED, rule)
    return True


async def relay_tunnel(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    route: Route,
    target: Authority,
    attempt: Attempt,
    network: Network,
    checked: bytes | None = None,
) -> None:
    """Relay a tunnel's bytes both ways (its opening checked first, unless ``checked`` already was)."""
    activity = Activity()
    up = _tunnel_up(reader, route, target, attempt, network, activity, checked)
    down = pipe(route.reader, writer, attempt.down, activity)
    if (ended := await relay(up, down, activity, network.limits.idle_timeout_s)) is not None:
        attempt.error = ended


async def _tunnel_up(
    reader: asyncio.StreamReader,
    route: Route,
    target: Authority,
    attempt: Attempt,
    network: Network,
    activity: Activity,
    checked: bytes | None,
) -> bool:
    data = checked if checked is not None else await checked_opening(reader, target, attempt, network)
    if data is None:
        return False
    if data:
        activity.touch()
        await send(route.writer, data, activity)
        attempt.up(len(data))
        await pipe(reader, route.writer, attempt.up, activity)
    if route.writer.can_write_eof():
        route.writer.write_eof()  # the client is done sending; the destination may still answer
    return True


async def checked_opening(
    reader: asyncio.StreamReader, target: Authority, attempt: Attempt, network: Network
) -> bytes | None:
    """The tunnel's first bytes, or None when they name another host or cannot be read (refused)."""
    try:
        data = await opening.read_opening(reader, network.limits)
    except opening.Unreadable as exc:
        attempt.decided(DENIED, f"unreadable opening: {exc}")
        return None
    if data:
        attempt.sni, rule = opening.refusal(data, target)
        if rule is not None:
            attempt.decided(DENIED, rule)
            return None
    return data


async def open_destination(
    target: Authority,
    writer: asyncio.StreamWriter,
    attempt: Attempt,
    policy: NetworkPolicy,
    network: Network,
    *,
    tunnel: bool,
) -> Route | None:
    """Connect to ``target`` as :func:`~pool.egress.connection.route.open_route` does; None when it was refused
    or unreachable (the client is told so, the attempt records why)."""
    try:
        return await open_route(target, policy, network, attempt, tunnel=tunnel)
    except Refused as exc:
        if exc.address is not None:
            attempt.address = str(exc.address)
        await refuse(writer, target, attempt, network, exc.rule)
    except Unreachable as exc:
        attempt.decided(UNREACHABLE, exc.rule, exc.error)
        await reply(writer, 502, f"snapgym egress: {target} unreachable: {exc.error}", network.limits.reply_timeout_s)
    return None


async def refuse(
    writer: asyncio.StreamWriter, target: Authority, attempt: Attempt, network: Network, rule: str
) -> None:
    """Record ``target`` as denied by ``rule`` and tell the client so (403)."""
    attempt.decided(DENIED, rule)
    message = f"snapgym egress: {target} refused in the {attempt.phase} phase ({rule})"
    await reply(writer, 403, message, network.limits.reply_timeout_s)
