"""A stand-in model API for the tests: Anthropic Messages and OpenAI Chat Completions / Responses over HTTPS.

``python -m tests.support.servers.model_server CONFIG.json`` (stdlib only; run inside the test
internet's namespace by ``model_fixtures``) serves, at ``config["address"]``
and ``config["port"]`` with the test CA's certificate:

- ``POST /v1/messages`` (Anthropic): a ``message`` object, or its event stream
  when the body says ``"stream": true``;
- ``POST /v1/chat/completions`` (OpenAI, as vLLM serves it): a ``chat.completion`` (a tool call
  as ``tool_calls``), or chunks ending with a usage chunk when streaming; with token ids and
  log-probabilities when the request asks (``inference.py``: vLLM's ``logprobs`` and
  ``return_token_ids``), each reply's tokens then appended to ``config["sent"]`` as a JSON line;
- ``POST /v1/responses`` (OpenAI Responses): a ``response``, or its events
  ending with ``response.completed``;
- ``GET /v1/models``: one model.

A request without the configured key (``x-api-key`` or ``Authorization:
Bearer``) gets 401. What the model says is scripted: the JSON list in
``config["script"]``, read at every request, one entry per turn in order
(the last repeats; a new script starts again at its first; a request that carries a conversation
is at the turn of its assistant messages), each ``{"text": ...}``, ``{"tool": {"name": ..., "input": {...}}}``
(call that tool: Anthropic ``tool_use``, Responses ``function_call``), ``{"echo_headers": true}`` (say
the request's headers back), or ``{"status": N, "headers": {...}}`` (answer
that status with those headers and no body). Usage is fixed: 11 input and 7
output tokens per call, the ``Server`` header is uvicorn's (as vLLM's). Every request (headers, body) is appended to
``config["log"]`` as one JSON line before it is answered.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.servers import inference

INPUT_TOKENS = 11
OUTPUT_TOKENS = 7


class ModelHandler(BaseHTTPRequestHandler):
    """Answers one request as the scripted model."""

    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    server: ModelServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._answer(b"")

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self._answer(self.rfile.read(length))

    def _answer(self, raw: bytes) -> None:
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        turn = self.server.record(self.command, self.path, headers, body)
        key = self.server.config["api_key"]
        if headers.get("x-api-key") != key and headers.get("authorization") != f"Bearer {key}":
            self._send_json(401, {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}})
            return
        if self.path.startswith("/v1/models"):
            self._send_json(200, {"data": [{"id": "stand-in", "type": "model"}]})
            return
        entry = self.server.script_entry(_conversation_turn(body, turn))
        if "status" in entry:
            self._send(int(entry["status"]), b"", dict(entry.get("headers", {})))
            return
        text = json.dumps(headers, sort_keys=True) if entry.get("echo_headers") else str(entry.get("text", ""))
        stream = isinstance(body, dict) and bool(body.get("stream"))
        if self.path.startswith("/v1/messages"):
            self._messages(text, stream, entry.get("tool"))
        elif self.path.startswith("/v1/chat/completions"):
            self._chat(text, stream, entry.get("tool"), body)
        elif self.path.startswith("/v1/responses"):
            self._responses(text, stream, entry.get("tool"))
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})

    def _messages(self, text: str, stream: bool, tool: dict[str, Any] | None) -> None:
        block: dict[str, Any] = {"type": "text", "text": text}
        if tool is not None:
            block = {
                "type": "tool_use",
                "id": f"toolu_{time.monotonic_ns()}",
                "name": tool["name"],
                "input": tool["input"],
            }
        message = {
            "id": "msg_standin", "type": "message", "role": "assistant", "model": "stand-in",
            "content": [block], "stop_reason": "tool_use" if tool else "end_turn",
            "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS},
        }  # fmt: skip
        if not stream:
            self._send_json(200, message)
            return
        start = {**message, "content": [], "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": 1}}
        if tool is None:
            opening, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": text}
        else:
            opening = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(tool["input"])}
        self._send_events([
            ("message_start", {"type": "message_start", "message": start}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": opening}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"]},
                               "usage": {"output_tokens": OUTPUT_TOKENS}}),
            ("message_stop", {"type": "message_stop"}),
        ])  # fmt: skip

    def _chat(self, text: str, stream: bool, tool: dict[str, Any] | None, body: Any) -> None:
        usage = {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
                 "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}  # fmt: skip
        message: dict[str, Any] = {"role": "assistant", "content": text}
        said = text
        if tool is not None:
            said = json.dumps(tool["input"])
            call = {"id": f"chatcmpl-tool-{time.monotonic_ns()}", "type": "function",
                    "function": {"name": tool["name"], "arguments": said}}  # fmt: skip
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "tool_calls" if tool is not None else "stop"
        sampled = inference.sample(body, said)
        if inference.asks_for_ids(body) or inference.asks_for_logprobs(body):
            self.server.sent(sampled)
        head = {"id": "chatcmpl-standin", "model": "stand-in", "created": int(time.time()), "system_fingerprint": None}
        if not stream:
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            reply = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            self._send_json(200, inference.decorate(reply, body, sampled))
            return
        chunk = {**head, "object": "chat.completion.chunk"}
        deltas: list[dict[str, Any]]
        if tool is not None:  # the call in one delta, as vLLM's tool parsers send a short one
            deltas = [{"role": "assistant", "content": None, "tool_calls": [{**message["tool_calls"][0], "index": 0}]}]
            spans = [(0, len(sampled.pieces))]
        else:  # a piece of text (a token) per chunk
            deltas = [{"role": "assistant", "content": ""}] + [{"content": piece} for piece in sampled.pieces]
            spans = [(0, 0)] + [(i, i + 1) for i in range(len(sampled.pieces))]
        events: list[tuple[str | None, Any]] = [
            (None, inference.decorate_chunk({**chunk, "choices": [{"index": 0, "delta": delta}]}, body, sampled, *span))
            for delta, span in zip(deltas, spans, strict=True)
        ]
        events.append((None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
        events.append((None, {**chunk, "choices": [], "usage": usage}))
        self._send_events(events, done=True)

    def _responses(self, text: str, stream: bool, tool: dict[str, Any] | None) -> None:
        stamp = time.monotonic_ns()
        if tool is None:
            part = {"type": "output_text", "text": text, "annotations": []}
            item: dict[str, Any] = {"id": f"msg_{stamp}", "type": "message", "role": "assistant",
                                    "status": "completed", "content": [part]}  # fmt: skip
        else:
            item = {"id": f"fc_{stamp}", "type": "function_call", "status": "completed", "call_id": f"call_{stamp}",
                    "name": tool["name"], "arguments": json.dumps(tool["input"])}  # fmt: skip
        usage = {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS,
                 "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
        response = {"id": f"resp_{stamp}", "object": "response", "model": "stand-in", "status": "completed",
                    "output": [item], "usage": usage}  # fmt: skip
        if not stream:
            self._send_json(200, response)
            return
        opened = {**item, "status": "in_progress", **({"content": []} if tool is None else {"arguments": ""})}
        where = {"item_id": item["id"], "output_index": 0}
        if tool is None:
            middle = [
                ("response.content_part.added", {**where, "content_index": 0, "part": {**part, "text": ""}}),
                ("response.output_text.delta", {**where, "content_index": 0, "delta": text}),
                ("response.output_text.done", {**where, "content_index": 0, "text": text}),
                ("response.content_part.done", {**where, "content_index": 0, "part": part}),
            ]
        else:
            middle = [
                ("response.function_call_arguments.delta", {**where, "delta": item["arguments"]}),
                ("response.function_call_arguments.done", {**where, "arguments": item["arguments"]}),
            ]
        events = [
            ("response.created", {"response": {**response, "status": "in_progress", "output": [], "usage": None}}),
            ("response.output_item.added", {"output_index": 0, "item": opened}),
            *middle,
            ("response.output_item.done", {"output_index": 0, "item": item}),
            ("response.completed", {"response": response}),
        ]
        self._send_events(
            [(name, {"type": name, "sequence_number": n, **data}) for n, (name, data) in enumerate(events)]
        )

    def _send_events(self, events: list[tuple[str | None, Any]], *, done: bool = False) -> None:
        parts = [(f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n" for name, data in events]
        if done:
            parts.append("data: [DONE]\n\n")
        self._send(200, "".join(parts).encode(), {"content-type": "text/event-stream"})

    def _send_json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), {"content-type": "application/json"})

    def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class ModelServer(ThreadingHTTPServer):
    """The HTTPS server, its config, its turn counter and its log."""

    daemon_threads = True

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__((config["address"], int(config["port"])), ModelHandler)
        if config.get("cert"):  # plain HTTP without one (for trying a CLI by hand)
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(config["cert"], config["key"])
            self.socket = context.wrap_socket(self.socket, server_side=True)
        self.config = config
        self._lock = threading.Lock()
        self._turns = 0
        self._script_text = ""
        self._log = os.open(config["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sent = config.get("sent")
        self._sent = os.open(sent, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if sent else -1

    def record(self, method: str, path: str, headers: dict[str, str], body: Any) -> int:
        """Log the request; its turn number (from 0, counting POSTs since the script last changed)."""
        with self._lock:
            with open(self.config["script"]) as script:
                text = script.read()
            if text != self._script_text:
                self._script_text, self._turns = text, 0
            turn = self._turns
            if method == "POST":
                self._turns += 1
            line = {"time": time.time(), "method": method, "path": path, "headers": headers, "body": body}
            os.write(self._log, (json.dumps(line, sort_keys=True) + "\n").encode())
        return turn

    def sent(self, sampled: inference.Sampled) -> None:
        """Keep the tokens of a reply that carries them (one JSON line, in the order the replies go)."""
        if self._sent >= 0:
            with self._lock:
                os.write(self._sent, (json.dumps(sampled.as_dict()) + "\n").encode())

    def script_entry(self, turn: int) -> dict[str, Any]:
        """The scripted entry for ``turn`` (the last one repeats)."""
        with open(self.config["script"]) as script:
            entries = json.load(script) or [{"text": ""}]
        entry: dict[str, Any] = entries[min(turn, len(entries) - 1)]
        return entry


def _conversation_turn(body: Any, counted: int) -> int:
    """Which scripted entry answers: the assistant turns already in the conversation when the request
    carries one (a CLI agent's side requests then do not shift the script), else the count of calls."""
    if isinstance(body, dict) and isinstance(body.get("messages"), list):
        return sum(isinstance(m, dict) and m.get("role") == "assistant" for m in body["messages"])
    if isinstance(body, dict) and isinstance(body.get("input"), list):
        return sum(isinstance(i, dict) and i.get("type") == "function_call" for i in body["input"])
    return counted


def main() -> None:
    with open(sys.argv[1]) as file:
        config = json.load(file)
    server = ModelServer(config)
    with open(config["ready_file"], "w") as ready:
        ready.write("ready\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
