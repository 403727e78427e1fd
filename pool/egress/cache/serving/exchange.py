"""What serving one intercepted request needs, in replay and in record alike: the connection's
context, the audit mark, reading the request body, answering with an error."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from dataclasses import dataclass
from http import HTTPStatus

import h11

from pool.egress.cache.downloads import DownloadCache
from pool.egress.cache.transport.http import Peer
from pool.egress.cache.transport.origin import Origin, OriginFailed
from pool.egress.connection.attempt import Attempt
from pool.egress.connection.head import Authority
from pool.egress.limits import ProxyLimits

_PRECEDENCE = ("hit", "passed", "stored", "miss")
FAILURES = (h11.ProtocolError, OSError, TimeoutError, OriginFailed)
"""What an origin (or a client gone mid-answer) can fail with."""


class ClientFailed(Exception):
    """The client broke off inside a request, or sent one h11 cannot read."""


@dataclass(frozen=True, slots=True)
class Context:
    """One intercepted client connection: where it goes and what it may use."""

    cache: DownloadCache
    target: Authority
    """The host and port the proxy judged (CONNECT's, or the plain request's URL's)."""
    attempt: Attempt
    limits: ProxyLimits
    origin: Origin | None
    """Record mode: the origin connection; None in replay."""


def mark(attempt: Attempt, outcome: str) -> None:
    """Note what the cache did; a connection with several requests keeps the most telling
    (``miss`` over ``stored`` over ``passed`` over ``hit``)."""
    if attempt.cache is None or _PRECEDENCE.index(outcome) > _PRECEDENCE.index(attempt.cache):
        attempt.cache = outcome


async def read_body(client: Peer, peer: Peer | None) -> str:
    """Read the request's body from ``client`` (sending it on to ``peer``); its SHA-256.

    Raises:
        ClientFailed: the client broke off or sent malformed HTTP (errors of ``peer`` pass as they are).
    """
    hasher = hashlib.sha256()
    while True:
        try:
            event = await client.next_event()
        except (h11.ProtocolError, OSError, TimeoutError) as exc:
            raise ClientFailed(f"the request body did not arrive ({why(exc)})") from None
        if isinstance(event, h11.EndOfMessage):
            return hasher.hexdigest()
        if not isinstance(event, h11.Data):
            raise ClientFailed("the client closed inside its request body")
        hasher.update(event.data)
        if peer is not None:
            await peer.send(h11.Data(data=event.data))


async def answer(context: Context, client: Peer, status: int, text: str) -> None:
    """A one-line text response that ends the connection (when the client can still be answered,
    within the reply timeout)."""
    payload = (text + "\n").encode()
    headers = [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(payload))),
               ("Connection", "close")]  # fmt: skip
    with contextlib.suppress(h11.ProtocolError, OSError, TimeoutError):
        async with asyncio.timeout(context.limits.reply_timeout_s):
            await client.send(h11.Response(status_code=status, reason=HTTPStatus(status).phrase, headers=headers))
            await client.send(h11.Data(data=payload))
            await client.send(h11.EndOfMessage())


def why(exc: BaseException) -> str:
    """A failure in words, for a record and a 502's body."""
    if isinstance(exc, OriginFailed | h11.ProtocolError):
        return str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError):
        return f"connection lost ({(exc.strerror or type(exc).__name__).lower()})"
    return type(exc).__name__
