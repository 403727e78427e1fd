"""A minimal client of OpenAI-compatible chat completions (``POST {base_url}/chat/completions``).

It speaks the wire protocol directly with the standard library, so any
server that implements it works (OpenAI, vLLM, SGLang, llama.cpp, LiteLLM,
Ollama). Transient failures (connection errors, timeouts, 429, 5xx, and a
reply that is not a completion: not JSON, cut short, an ``error`` object
or no ``choices[0].message`` even under HTTP 200, as proxies send when the
model behind them fails) are retried with exponential backoff and then raise
ModelUnavailableError (an infrastructure failure, never the agent's); a
request the server refuses (400, 401, 403, 404) raises ModelRequestError at
once, since retrying cannot fix it.

With ``capture_tokens``, each request also asks for the completion's token ids and log-probabilities
(vLLM's and SGLang's fields, :mod:`pool.egress.models.tokens`), and the reply keeps them as the server
sent them, or says why there are none.

:class:`EndpointProbe` tells the runner whether the endpoint serves at all
(see ``benchmarks.episodes.outage``): one minimal completion (``max_tokens: 1``),
sent only after an attempt failed on infrastructure and then between the
backoff pauses of an outage.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.agents.base import ModelRequestError, ModelUnavailableError
from benchmarks.agents.calls import CallCutError, Calls
from pool.egress.models import tokens

Message = dict[str, str]
_RETRIED_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
DEFAULT_TIMEOUT_S = 120.0
"""How long one request may take: the default of every endpoint (``ChatEndpoint``, ``LLMAgent``, ``agent=llm``)."""
DEFAULT_MAX_RETRIES = 4
"""Retries of a transient failure before giving up: the default of every endpoint, as ``DEFAULT_TIMEOUT_S``."""


@dataclass(frozen=True, slots=True)
class ChatEndpoint:
    """Where and how to ask the model."""

    base_url: str
    """e.g. ``https://api.openai.com/v1`` or ``http://localhost:8000/v1``."""
    model: str
    """The ``model`` field of the request."""
    api_key: str | None
    """Sent as ``Authorization: Bearer``; read from the environment by the caller, never logged."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Per request."""
    max_retries: int = DEFAULT_MAX_RETRIES
    """Retries of a transient failure before giving up."""
    backoff_s: float = 1.0
    """First retry delay; doubles each time."""
    capture_tokens: bool = False
    """Ask for each completion's token ids and log-probabilities (an inference server's fields)."""


@dataclass(frozen=True, slots=True)
class ChatReply:
    """The first choice's text and the token usage the server reported."""

    content: str
    prompt_tokens: int
    completion_tokens: int
    tokens: dict[str, Any] | None = None
    """With ``capture_tokens``: the token record (``pool.egress.models.tokens.TokenCapture.as_dict``)."""


def complete(
    endpoint: ChatEndpoint, messages: Sequence[Message], *, calls: Calls | None = None, **params: Any
) -> ChatReply:
    """Ask for one completion of ``messages`` (extra ``params`` such as temperature go in the body).

    ``calls``: the agent's requests (see ``benchmarks.agents.calls``): a stopping run cuts this one, and
    then nothing is retried.
    """
    request = {"model": endpoint.model, "messages": list(messages), **params}
    if endpoint.capture_tokens:
        request, _ = tokens.ask(request)
    body = json.dumps(request).encode()
    delay = endpoint.backoff_s
    for attempt in range(endpoint.max_retries + 1):
        try:
            payload, server = _post(endpoint, body, calls)
            reply = _parse_reply(payload)
            if endpoint.capture_tokens:
                reply = dataclasses.replace(reply, tokens=tokens.read_reply(payload, server=server).as_dict())
        except ModelUnavailableError:
            if attempt == endpoint.max_retries or (calls is not None and calls.is_cut):
                raise
        else:
            if calls is not None:
                calls.note_answer()
            return reply
        if calls is None:
            time.sleep(delay)
        else:
            try:
                calls.sleep(delay)
            except CallCutError:
                raise ModelUnavailableError(f"{endpoint.base_url}: not retried: the run is stopping") from None
        delay *= 2
    raise AssertionError("unreachable")


def _post(endpoint: ChatEndpoint, body: bytes, calls: Calls | None = None) -> tuple[Any, str | None]:
    """The reply's JSON and its ``Server`` header."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if endpoint.api_key:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    request = urllib.request.Request(
        endpoint.base_url.rstrip("/") + "/chat/completions", data=body, headers=headers, method="POST"
    )
    open_request = urllib.request.urlopen if calls is None else calls.open
    try:
        with open_request(request, timeout=endpoint.timeout_s) as response:
            payload: Any = json.loads(response.read())
            return payload, response.headers.get("server")
    except CallCutError:
        raise ModelUnavailableError(f"{endpoint.base_url}: the request was cut: the run is stopping") from None
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:500].decode("utf-8", "replace")
        message = f"{endpoint.base_url}: HTTP {exc.code} for model {endpoint.model!r}: {detail}"
        if exc.code in _RETRIED_STATUS:
            raise ModelUnavailableError(message) from None
        raise ModelRequestError(message + " (check agent.base_url, agent.model and the API key)") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        if calls is not None and calls.is_cut:
            raise ModelUnavailableError(f"{endpoint.base_url}: the request was cut: the run is stopping") from None
        raise ModelUnavailableError(f"{endpoint.base_url}: cannot reach the model server ({reason})") from None
    except json.JSONDecodeError:
        raise ModelUnavailableError(f"{endpoint.base_url}: the reply was not JSON") from None


_PROBE_MESSAGES = ({"role": "user", "content": "Reply with: ok"},)
_PROBE_TIMEOUT_S = 10.0


class EndpointProbe:
    """Whether a chat endpoint serves: the runner's health probe of the model (see ``benchmarks.episodes.outage``).

    Args:
        endpoint: the endpoint the agent talks to.
        calls: the agent's requests: a reply to any of them (or to the probe) is the endpoint answering.
    """

    def __init__(self, endpoint: ChatEndpoint, calls: Calls | None = None) -> None:
        self._endpoint = dataclasses.replace(endpoint, timeout_s=min(endpoint.timeout_s, _PROBE_TIMEOUT_S))
        self._calls = calls or Calls()

    @property
    def has_answered(self) -> bool:
        """True once the endpoint replied to the agent or to this probe in this run."""
        return self._calls.answered

    @property
    def health_name(self) -> str:
        """For outage messages (its errors name the URL, never the key)."""
        return "the model endpoint"

    @property
    def health_hint(self) -> str:
        """What to check when the endpoint never answered."""
        return (
            f"is the model server running, and are agent.base_url={self._endpoint.base_url} and "
            f"agent.model={self._endpoint.model} right?"
        )

    def check_health(self) -> str | None:
        """None when one minimal completion comes back (or the server refuses it: it answers, so it is up)."""
        body = json.dumps({"model": self._endpoint.model, "messages": list(_PROBE_MESSAGES), "max_tokens": 1})
        try:
            _parse_reply(_post(self._endpoint, body.encode())[0])
        except ModelUnavailableError as exc:
            return str(exc)
        except ModelRequestError:
            pass
        self._calls.note_answer()
        return None

    def recover(self) -> None:
        """Nothing to repair from here: the endpoint comes back by itself, or not."""


def _parse_reply(payload: Any) -> ChatReply:
    """The reply's first choice; a body that is not a completion is the endpoint failing."""
    if isinstance(payload, dict) and payload.get("error"):
        error = json.dumps(payload["error"], default=str)[:300]
        raise ModelUnavailableError(f"the endpoint answered with an error: {error}")
    try:
        content = payload["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ModelUnavailableError(
            f"the endpoint's reply is not a completion (no choices[0].message): {str(payload)[:300]}"
        ) from None
    usage = payload.get("usage") or {}
    tokens = (int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))  # null: not counted
    return ChatReply(str(content or ""), *tokens)
