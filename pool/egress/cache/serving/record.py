"""Forwarding an intercepted request to its origin and storing the response on the way back (``record``).

Never stored: the response to a request with ``Authorization`` or ``Cookie`` (it may be the
credential holder's alone, and the key does not include the credential, so a later run without
it would be given it), and any ``Set-Cookie`` header of a stored response (a session issued to
whoever recorded). ``Cache-Control`` is not consulted: this is a recording for reproducibility,
not an HTTP cache, and without credentials the response is what any client gets.
"""

from __future__ import annotations

from dataclasses import replace

import h11

from pool.egress.cache.key import BODILESS_METHODS, RequestKey
from pool.egress.cache.serving.exchange import FAILURES, Context, answer, mark, read_body, why
from pool.egress.cache.store import BlobWriter
from pool.egress.cache.transport.http import Peer, encoded, passed_on, text_headers, values
from pool.egress.cache.transport.origin import Origin, OriginFailed
from pool.network.audit import UNREACHABLE

_CREDENTIALS = ("authorization", "cookie")


async def record(
    context: Context,
    origin: Origin,
    client: Peer,
    key: RequestKey,
    headers: list[tuple[str, str]],
    close: list[tuple[str, str]],
) -> bool:
    """Forward the request ``key`` (with the client's ``headers``; its body still to be read) and
    pass the answer back, storing it when it may be; False when the connection must end."""
    attempt = context.attempt
    sent = passed_on(headers)
    if values(headers, "transfer-encoding"):
        sent.append(("Transfer-Encoding", "chunked"))  # h11 frames requests only as told
    try:
        peer = await origin.peer()
        await peer.send(origin.request(key.method, key.target, sent))
        body = await read_body(client, peer)
        await peer.send(h11.EndOfMessage())
        response = await _response(peer)
    except FAILURES as exc:
        origin.close()
        attempt.decided(UNREACHABLE, attempt.rule, f"record: {why(exc)}")
        await answer(context, client, 502, f"snapgym egress: {key.url}: {why(exc)}")
        return False
    key = replace(key, body_sha256=None if key.method in BODILESS_METHODS else body)
    storable = not any(values(headers, name) for name in _CREDENTIALS)
    if not await _pass_back(context, peer, client, key, response, storable, close):
        origin.close()
        return False
    origin.finished()
    return True


async def _pass_back(
    context: Context,
    peer: Peer,
    client: Peer,
    key: RequestKey,
    response: h11.Response,
    storable: bool,
    close: list[tuple[str, str]],
) -> bool:
    attempt = context.attempt
    headers = text_headers(response.headers)
    head = h11.Response(status_code=response.status_code, reason=response.reason,
                        headers=encoded([*passed_on(headers), *close]))  # fmt: skip
    body = context.cache.store.writer(context.cache.settings.max_body_bytes) if storable else None
    try:
        await client.send(head)
        while not isinstance(event := await peer.next_event(), h11.EndOfMessage):
            if not isinstance(event, h11.Data):
                raise OriginFailed("the origin closed inside its response")
            await client.send(h11.Data(data=event.data))
            if body is not None:
                body.write(event.data)
        await client.send(h11.EndOfMessage())
        framed = values(headers, "content-length") or values(headers, "transfer-encoding")
        whole = bool(framed) or not peer.stream.is_truncated  # a close-delimited body cut short is not whole
        mark(attempt, _store(context, key, response, headers, body) if body is not None and whole else "passed")
    except FAILURES as exc:
        attempt.error = f"record: {why(exc)}"
        return False
    finally:
        if body is not None:
            body.discard()
    return True


def _store(
    context: Context, key: RequestKey, response: h11.Response, headers: list[tuple[str, str]], body: BlobWriter
) -> str:
    if not body.is_kept:
        return "passed"  # over the size cap
    kept = passed_on(headers, drop=frozenset({"set-cookie"}))
    try:
        context.cache.store.put(key, response.status_code, response.reason.decode("latin-1"), kept, body)
    except OSError as exc:
        context.attempt.error = f"record: could not store {key.url}: {exc.strerror or type(exc).__name__}"
        return "passed"
    return "stored"


async def _response(peer: Peer) -> h11.Response:
    while True:
        event = await peer.next_event()
        if isinstance(event, h11.Response):
            return event
        if not isinstance(event, h11.InformationalResponse):
            raise OriginFailed("the origin closed without answering")
