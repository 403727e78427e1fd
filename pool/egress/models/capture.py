"""What the gateway changes in a call on a route that captures tokens or translates: the request it
sends, and the reply the agent gets, as the reply streams through.

A plain route forwards bytes. A route with ``capture_tokens`` asks the upstream for token data on every
chat completion (:func:`pool.egress.models.tokens.ask`), reads it from the reply (a JSON body, or each
``data:`` line of an event stream as it comes) and hands the agent the reply without it. A route that
translates (:mod:`pool.egress.models.translate`) sends Chat Completions for Anthropic Messages and
answers with the message once the upstream's completion is complete.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from pool.egress.models import tokens, translate
from pool.egress.models.routes import ModelRoute
from pool.egress.models.tokens import TokenCapture
from pool.egress.models.usage import MAX_BODY_BYTES

CHAT_PATH = "/v1/chat/completions"
MESSAGES_PATH = "/v1/messages"


class Rewriter(Protocol):
    """One call's changes: the upstream request, then the reply, chunk by chunk."""

    path: str
    """The upstream path (and query) to send to."""
    body: bytes
    """The request body to send."""

    def start(self, status: int, headers: Mapping[str, str]) -> str | None:
        """The upstream answered with ``status``; the content type the agent gets (None: the upstream's)."""

    def feed(self, chunk: bytes) -> bytes:
        """What the agent gets for the next chunk of the upstream's reply."""

    def finish(self) -> bytes:
        """What the agent gets after the upstream's reply ended."""

    def captured(self) -> TokenCapture | None:
        """The call's tokens (after :meth:`finish`); None when the route does not capture them."""


def rewriter_for(
    route: ModelRoute, method: str, path_qs: str, body: bytes
) -> tuple[Rewriter | None, TokenCapture | None]:
    """How the gateway changes this call (None: not at all), or, for a call whose tokens cannot be had,
    the record that says why."""
    path = path_qs.split("?", 1)[0]
    if method != "POST":
        return None, None
    request = _json_object(body)
    if route.upstream_api and route.upstream_api != route.api and path == MESSAGES_PATH and request is not None:
        return MessagesTranslation(request, capture=route.capture_tokens), None
    if not route.capture_tokens:
        return None, None
    if path == CHAT_PATH and request is not None:
        return ChatCapture(request, path_qs), None
    why = f"token ids are captured from chat completions ({CHAT_PATH}); this call was {path}"
    if request is None:
        why = "the request body was not a JSON object"
    return None, tokens.missing(why, model=str(request.get("model")) if request and request.get("model") else None)


class ChatCapture:
    """A chat completion whose token data is asked for, read, and kept from the agent."""

    def __init__(self, request: Mapping[str, Any], path_qs: str) -> None:
        asked, self._hidden = tokens.ask(request)
        self.path, self.body = path_qs, json.dumps(asked).encode()
        self._mode = "pass"
        self._held = bytearray()
        self._events: list[Any] = []
        self._server: str | None = None
        self._tokens: TokenCapture | None = None

    def start(self, status: int, headers: Mapping[str, str]) -> str | None:
        self._server = headers.get("server")
        if status != 200:
            self._tokens = tokens.missing(f"the upstream answered HTTP {status}", server=self._server)
        else:
            self._mode = "events" if "text/event-stream" in headers.get("content-type", "") else "json"
        return None

    def feed(self, chunk: bytes) -> bytes:
        if self._mode == "pass":
            return chunk
        self._held += chunk
        if len(self._held) > MAX_BODY_BYTES:  # too long to hold: the rest goes through as it is
            self._mode, held = "pass", bytes(self._held)
            self._tokens = tokens.missing(f"the reply was longer than {MAX_BODY_BYTES} bytes", server=self._server)
            self._held.clear()
            return held
        if self._mode == "json":
            return b""
        cut = self._held.rfind(b"\n") + 1
        lines, self._held = bytes(self._held[:cut]), self._held[cut:]
        return self._lines(lines)

    def finish(self) -> bytes:
        if self._mode == "json":
            payload = _json_any(bytes(self._held))
            self._tokens = tokens.read_reply(payload, server=self._server)
            if not isinstance(payload, dict):
                return bytes(self._held)
            return json.dumps(tokens.strip(payload, self._hidden)).encode()
        if self._mode == "events":
            out = self._lines(bytes(self._held))
            self._tokens = tokens.read_events(self._events, server=self._server)
            return out
        return b""

    def captured(self) -> TokenCapture | None:
        return self._tokens

    def _lines(self, data: bytes) -> bytes:
        out = []
        for line in data.splitlines(keepends=True):
            text = line.strip()
            document = _json_any(text[5:].strip()) if text.startswith(b"data:") else None
            if isinstance(document, dict):
                self._events.append(document)
                ending = line[len(line.rstrip(b"\r\n")) :]
                line = b"data: " + json.dumps(tokens.strip(document, self._hidden)).encode() + ending
            out.append(line)
        return b"".join(out)


class MessagesTranslation:
    """An Anthropic Messages call answered by a Chat Completions upstream (see pool.egress.models.translate)."""

    def __init__(self, request: Mapping[str, Any], *, capture: bool) -> None:
        chat = translate.chat_request(request)
        if capture:
            chat, _ = tokens.ask(chat)
        self.path, self.body = CHAT_PATH, json.dumps(chat).encode()
        self._capture, self._stream = capture, bool(request.get("stream"))
        self._status = 0
        self._held = bytearray()
        self._server: str | None = None
        self._tokens: TokenCapture | None = None

    def start(self, status: int, headers: Mapping[str, str]) -> str | None:
        self._status, self._server = status, headers.get("server")
        return "text/event-stream" if self._stream and status == 200 else "application/json"

    def feed(self, chunk: bytes) -> bytes:
        if len(self._held) <= MAX_BODY_BYTES:
            self._held += chunk
        return b""

    def finish(self) -> bytes:
        body = bytes(self._held)
        if self._status != 200:
            self._missing(f"the upstream answered HTTP {self._status}")
            return json.dumps(translate.error_reply(self._status, body)).encode()
        completion = _json_any(body)
        try:
            message = translate.message_reply(completion)
        except ValueError as exc:
            self._missing(str(exc))
            return json.dumps(translate.error_reply(502, body)).encode()
        if self._capture:
            self._tokens = tokens.read_reply(completion, server=self._server)
        return translate.message_events(message) if self._stream else json.dumps(message).encode()

    def captured(self) -> TokenCapture | None:
        return self._tokens

    def _missing(self, why: str) -> None:
        if self._capture:
            self._tokens = tokens.missing(why, server=self._server)


def _json_object(body: bytes) -> dict[str, Any] | None:
    found = _json_any(body)
    return found if isinstance(found, dict) else None


def _json_any(data: bytes) -> Any:
    try:
        return json.loads(data) if data else None
    except (ValueError, UnicodeDecodeError):
        return None
