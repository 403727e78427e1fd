"""Anthropic Messages in front of an OpenAI Chat Completions upstream: the request and the reply, translated.

Claude Code speaks only Anthropic Messages; the inference servers a trainer runs (vLLM, SGLang)
return token ids and log-probabilities only in Chat Completions. A route with
``upstream_api: openai`` on an ``anthropic`` API (:mod:`pool.egress.models.routes`) translates,
as LiteLLM and vLLM's own ``/v1/messages`` do: the system prompt and the messages (text,
``tool_use`` as ``tool_calls``, ``tool_result`` as ``tool`` messages), the tools (``input_schema``
as ``parameters``), ``tool_choice``, ``max_tokens``, ``stop_sequences``, ``temperature``, ``top_p``,
``top_k``. The upstream is asked without streaming; a client that asked for a stream gets the whole
message as Anthropic's event stream (``message_start`` ... ``message_stop``) once it is complete.
Images and thinking blocks are not sent on (an inference server's chat template has no place for a
thinking block it did not write).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use"}
_SAMPLING = {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
             "stop_sequences": "stop"}  # fmt: skip


def chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Chat Completions request for an Anthropic Messages request (never streamed)."""
    messages: list[dict[str, Any]] = []
    system = _text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            messages.extend(_chat_messages(message))
    request: dict[str, Any] = {"model": body.get("model"), "messages": messages, "stream": False}
    for name, chat_name in _SAMPLING.items():
        if body.get(name) is not None:
            request[chat_name] = body[name]
    tools = [_chat_tool(t) for t in body.get("tools") or [] if isinstance(t, dict) and t.get("name")]
    if tools:
        request["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"))
        if choice is not None:
            request["tool_choice"] = choice
    return request


def message_reply(completion: Any) -> dict[str, Any]:
    """The Anthropic ``message`` for a ``chat.completion``.

    Raises:
        ValueError: the completion has no ``choices[0].message``.
    """
    try:
        choice = completion["choices"][0]
        said = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"the upstream's reply is not a chat completion: {str(completion)[:300]}") from None
    content: list[dict[str, Any]] = []
    if said.get("content"):
        content.append({"type": "text", "text": str(said["content"])})
    for call in said.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append({
            "type": "tool_use", "id": str(call.get("id") or f"toolu_{len(content)}"),
            "name": str(function.get("name", "")), "input": _arguments(function.get("arguments")),
        })  # fmt: skip
    usage = completion.get("usage") or {}
    counts = {
        "input_tokens": int(usage.get("prompt_tokens") or 0),
        "output_tokens": int(usage.get("completion_tokens") or 0),
    }
    return {
        "id": f"msg_{completion.get('id', 'translated')}", "type": "message", "role": "assistant",
        "model": completion.get("model"), "content": content,
        "stop_reason": _STOP_REASONS.get(str(choice.get("finish_reason")), "end_turn"), "stop_sequence": None,
        "usage": counts,
    }  # fmt: skip


def message_events(message: Mapping[str, Any]) -> bytes:
    """``message`` as Anthropic's event stream, as the Messages API streams a reply."""
    start = {**message, "content": [], "stop_reason": None, "usage": {**message["usage"], "output_tokens": 0}}
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            delta: dict[str, Any] = {"type": "text_delta", "text": block["text"]}
        else:
            opening = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [
            ("content_block_start", {"type": "content_block_start", "index": index, "content_block": opening}),
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]
    events += [
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"]},
                           "usage": {"output_tokens": message["usage"]["output_tokens"]}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()


def error_reply(status: int, body: bytes) -> dict[str, Any]:
    """An upstream's error (any shape) as Anthropic's error object."""
    try:
        found = json.loads(body)
        error = found.get("error", found) if isinstance(found, dict) else found
        text = error.get("message", json.dumps(error)) if isinstance(error, dict) else str(error)
    except (ValueError, UnicodeDecodeError):
        text = body[:500].decode("utf-8", "replace")
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 429: "rate_limit_error"}.get(status, "api_error")  # fmt: skip
    return {"type": "error", "error": {"type": kind, "message": f"upstream HTTP {status}: {str(text)[:500]}"}}


def _chat_messages(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    role, content = message.get("role"), message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    blocks = [b for b in content or [] if isinstance(b, dict)]
    results = [
        {"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")), "content": _text(b.get("content"))}
        for b in blocks if b.get("type") == "tool_result"
    ]  # fmt: skip
    text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
    calls = [
        {"id": str(b.get("id", "")), "type": "function",
         "function": {"name": str(b.get("name", "")), "arguments": json.dumps(b.get("input") or {})}}
        for b in blocks if b.get("type") == "tool_use"
    ]  # fmt: skip
    out: list[dict[str, Any]] = list(results)
    if role == "assistant" and (text or calls):
        out.append({"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})})
    elif role != "assistant" and text:
        out.append({"role": role, "content": text})
    return out


def _chat_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(str(kind)) if kind else None


def _text(value: Any) -> str:
    """A system prompt or tool result (a string or a list of blocks) as text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(str(b.get("text", "")) for b in value if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _arguments(value: Any) -> Any:
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value or "{}")
    except (TypeError, ValueError):
        return {"arguments": value}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}
