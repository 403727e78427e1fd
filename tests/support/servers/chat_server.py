"""A local stand-in for an OpenAI-compatible chat completions server, for tests of the llm agent.

It speaks the wire protocol (``POST /v1/chat/completions`` with a JSON body,
a ``chat.completion`` object back) on 127.0.0.1, from a thread, so the real
client (and the real runner, in a subprocess) talks to it unmodified. What it
answers is scripted: a list of replies taken in order, or a function of the
request; ``fail_next`` makes it answer with an HTTP error status first. Every
request is recorded (headers and body) for the test to inspect. A request that asks for token ids or
log-probabilities (vLLM's ``return_token_ids``, ``logprobs``) gets them with a scripted text, in vLLM's
format (``inference.py``), and what was sent is kept in ``sent``.

Test modules load it with ``pytest_plugins = ["tests.support.servers.chat_server"]`` (which gives
them the ``chat_server`` fixture) and import its helpers. It has no asserts of its own
(PYTEST_DONT_REWRITE: the test modules import it before pytest could rewrite it).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.support.servers import inference

COMPLETIONS_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names lower-cased."""
    raw_body: bytes
    body: Any
    """The JSON body, or None when it was not JSON."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's ``messages`` (empty when it had none)."""
        return list(self.body.get("messages", [])) if isinstance(self.body, dict) else []


@dataclass(frozen=True, slots=True)
class RawResponse:
    """A reply sent exactly as given, for malformed or truncated answers."""

    body: bytes
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})


Reply = str | dict[str, Any] | RawResponse
"""A text (wrapped in a chat.completion), a JSON object sent as the whole body, or a raw response."""
Script = Sequence[Reply] | Callable[[ChatRequest], Reply]


def completion(content: str | None, *, model: str = "scripted") -> dict[str, Any]:
    """The ``chat.completion`` object whose first choice says ``content``."""
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def error_body(status: int) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {"error": {"message": f"stand-in error {status}", "type": "standin_error", "code": status}}


class ChatServer:
    """The stand-in server; use it through the ``chat_server`` fixture (it is started and stopped there).

    Args:
        script: the replies, in order (after the last one it answers ``submit``), or a function of the request.
        port: where to listen (0: a free port); a test that stopped a server starts a new one on its port
            to play an endpoint that comes back.
    """

    def __init__(self, script: Script = (), *, port: int = 0) -> None:
        self.requests: list[ChatRequest] = []
        self.sent: list[inference.Sampled] = []
        """The tokens of every reply that carried some, in order."""
        self._lock = threading.Lock()
        self._failures: list[tuple[int, int | None]] = []
        self._served = 0
        self.script(script)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="chat-standin", daemon=True
        )

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``: what ``agent.base_url`` should be."""
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, script: Script) -> None:
        """Answer with ``script`` from now on (a list restarts at its first reply)."""
        with self._lock:
            self._script = script if callable(script) else list(script)
            self._served = 0

    def fail_next(self, status: int, times: int | None = 1) -> None:
        """Answer the next ``times`` requests (None: every request) with ``status`` before the script resumes."""
        with self._lock:
            self._failures.append((status, times))

    def stop_failing(self) -> None:
        """Drop the failures still pending: the script answers from the next request on."""
        with self._lock:
            self._failures.clear()

    def completions(self) -> list[ChatRequest]:
        """The requests that reached the completions path, in order."""
        with self._lock:
            return [r for r in self.requests if r.path == COMPLETIONS_PATH]

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def _answer(self, request: ChatRequest) -> RawResponse:
        with self._lock:
            self.requests.append(request)
            if request.method != "POST" or request.path != COMPLETIONS_PATH:
                return _json(error_body(404), 404)
            if self._failures:
                status, times = self._failures[0]
                if times is not None:
                    self._failures[0] = (status, times - 1)
                    if times - 1 <= 0:
                        self._failures.pop(0)
                return _json(error_body(status), status)
            script = self._script
            if callable(script):
                reply = script(request)
            else:
                reply = script[self._served] if self._served < len(script) else "submit"
                self._served += 1
        if isinstance(reply, RawResponse):
            return reply
        if not isinstance(reply, str):
            return _json(reply, 200)
        payload = completion(reply)
        if inference.asks_for_ids(request.body) or inference.asks_for_logprobs(request.body):
            sampled = inference.sample(request.body, reply)
            payload = inference.decorate(payload, request.body, sampled)
            with self._lock:
                self.sent.append(sampled)
        return _json(payload, 200)


def _json(payload: dict[str, Any], status: int) -> RawResponse:
    return RawResponse(json.dumps(payload).encode(), status)


def _handler_for(server: ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self._serve()

        def do_GET(self) -> None:
            self._serve()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep pytest's output clean

        def _serve(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                body = None
            headers = {name.lower(): value for name, value in self.headers.items()}
            response = server._answer(ChatRequest(self.command, self.path, headers, raw, body))
            self.send_response(response.status)
            for name, value in response.headers.items():
                self.send_header(name, value)
            if not any(name.lower() == "content-length" for name in response.headers):
                self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            self.wfile.write(response.body)

    return Handler


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    """A started stand-in server that answers ``submit`` until a test scripts it."""
    server = ChatServer()
    server.start()
    yield server
    server.close()
