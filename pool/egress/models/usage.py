"""Token usage read from a model API's reply: a JSON body or a server-sent event stream.

Both wire protocols report usage in a ``usage`` object, under different names
and in different places: Anthropic Messages (``usage`` of the message; when
streaming, ``message_start`` carries the input and ``message_delta`` the
running output count), OpenAI Chat Completions (``prompt_tokens`` and
``completion_tokens``; streamed in the last chunk when asked for) and OpenAI
Responses (``response.usage``, streamed in ``response.completed``). Counts
are cumulative where they repeat, so the largest seen is the total.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_BODY_BYTES = 16 << 20
"""Replies longer than this are forwarded but not read for usage (their usage is unknown)."""
_INPUT_KEYS = ("input_tokens", "prompt_tokens")
_OUTPUT_KEYS = ("output_tokens", "completion_tokens")
_CACHE_KEYS = ("cache_read_input_tokens", "cache_creation_input_tokens")


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one call used; None where the reply did not say."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    """Anthropic's cache reads and writes, OpenAI's ``cached_tokens`` (part of the input)."""


def read_usage(body: bytes, content_type: str) -> Usage:
    """The usage a complete reply reports (an SSE stream when ``content_type`` says so)."""
    documents = _events(body) if "text/event-stream" in content_type else [_json(body)]
    found: dict[str, int] = {}
    for document in documents:
        for usage in _usage_objects(document):
            _merge(found, usage)
    return Usage(found.get("input"), found.get("output"), found.get("cached"))


def _events(body: bytes) -> list[Any]:
    documents = []
    for line in body.splitlines():
        if line.startswith(b"data:"):
            documents.append(_json(line[5:].strip()))
    return documents


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


def _usage_objects(document: Any) -> list[dict[str, Any]]:
    """``usage`` at the top, or under ``message`` or ``response`` (stream events wrap it so)."""
    if not isinstance(document, dict):
        return []
    places = [document, document.get("message"), document.get("response")]
    return [p["usage"] for p in places if isinstance(p, dict) and isinstance(p.get("usage"), dict)]


def _merge(found: dict[str, int], usage: dict[str, Any]) -> None:
    for name, keys in (("input", _INPUT_KEYS), ("output", _OUTPUT_KEYS)):
        for key in keys:
            if _is_count(usage.get(key)):
                found[name] = max(found.get(name, 0), usage[key])
    cached = sum(usage[k] for k in _CACHE_KEYS if _is_count(usage.get(k)))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    if isinstance(details, dict) and _is_count(details.get("cached_tokens")):
        cached += details["cached_tokens"]
    if cached or any(_is_count(usage.get(k)) for k in _CACHE_KEYS):
        found["cached"] = max(found.get("cached", 0), cached)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
