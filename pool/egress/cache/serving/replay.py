"""Answering an intercepted request from the store, without connecting anywhere (``replay``)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import h11

from pool.egress.cache.key import BODILESS_METHODS, RequestKey
from pool.egress.cache.serving.exchange import Context, answer, mark, read_body
from pool.egress.cache.transport.http import Peer, encoded
from pool.egress.connection.relay import CHUNK_BYTES
from pool.network.audit import DENIED, REPLAY_MISS, UNREACHABLE


async def replay(context: Context, client: Peer, key: RequestKey, close: list[tuple[str, str]]) -> bool:
    """Answer the request ``key`` (its body still to be read) as recorded; False when the connection
    must end (no recording, or a corrupt one: the client was told, the attempt records it)."""
    attempt, store = context.attempt, context.cache.store
    body = await read_body(client, None)
    key = replace(key, body_sha256=None if key.method in BODILESS_METHODS else body)
    entry = store.lookup(key)
    if entry is None:
        mark(attempt, "miss")
        attempt.decided(DENIED, f"{REPLAY_MISS}{key.url}")
        text = f"snapgym egress: no recorded response for {key.method} {key.url} (cache: replay)"
        await answer(context, client, 504, text)
        return False
    if not await asyncio.to_thread(store.verify, entry):
        mark(attempt, "miss")
        attempt.decided(UNREACHABLE, attempt.rule, f"replay: the stored body of {key.url} does not match its digest")
        await answer(context, client, 502, f"snapgym egress: the cached response for {key.url} is corrupt; not served")
        return False
    head = h11.Response(status_code=entry.status, reason=entry.reason.encode("latin-1"),
                        headers=encoded([*entry.headers, *close]))  # fmt: skip
    await client.send(head)
    with store.open_body(entry) as file:
        while data := file.read(CHUNK_BYTES):
            await client.send(h11.Data(data=data))
    await client.send(h11.EndOfMessage())
    mark(attempt, "hit")
    return True
