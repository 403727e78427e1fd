"""Token capture: the token ids and log-probabilities an inference server returns with a chat completion.

A trainer cannot retokenise an agent's text and get back the tokens the model sampled, so each model
call keeps them as the server sent them. vLLM and SGLang return them in OpenAI Chat Completions when
asked (:data:`CAPTURE_FIELDS`): ``logprobs: true`` gives ``choices[].logprobs.content[]`` entries
``{token, logprob, bytes, top_logprobs}``; ``return_token_ids: true`` gives the completion's ids in
``choices[].token_ids`` and the prompt's in ``prompt_token_ids`` (vLLM: at the top of the reply, in the
first chunk when streaming; SGLang: in the choice, with ``return_prompt_token_ids: true``). Without ids,
a vLLM server started with ``--return-tokens-as-token-ids`` writes each token as ``"token_id:N"``,
which is read as the id. A server that returns none of it (OpenAI's own API refuses the fields) gives a
record whose ``why`` says what is missing.

:func:`ask` adds the fields to a request, :func:`read_reply` / :func:`read_events` read a reply's
tokens, and :func:`strip` takes off what the client did not ask for, so an agent sees a plain reply.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CAPTURE_FIELDS: dict[str, Any] = {"logprobs": True, "return_token_ids": True, "return_prompt_token_ids": True}
"""What a request carries to ask for token data (vLLM reads the first two, SGLang all three)."""
HIDDEN_LOGPROBS = "logprobs"
HIDDEN_IDS = "token_ids"
_TOKEN_ID_PREFIX = "token_id:"


@dataclass(frozen=True, slots=True)
class TokenCapture:
    """One model call's tokens as the server sent them; a list is None where the server sent none."""

    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    """The log-probability of each completion token, aligned with ``completion_token_ids``."""
    model: str | None = None
    """The reply's ``model``."""
    system_fingerprint: str | None = None
    """The reply's ``system_fingerprint`` (the serving configuration, where the server sends one)."""
    server: str | None = None
    """The reply's ``Server`` header (the serving software and, where it says, its version)."""
    why: str | None = None
    """Why the ids or log-probabilities are missing; None when all three lists are there."""

    def as_dict(self) -> dict[str, Any]:
        """The JSON-ready record (the fields of a line of an episode's ``tokens.jsonl``)."""
        version = {"system_fingerprint": self.system_fingerprint, "server": self.server}
        return {
            "model": self.model, "model_version": version, "prompt_token_ids": self.prompt_token_ids,
            "completion_token_ids": self.completion_token_ids, "logprobs": self.logprobs, "why": self.why,
        }  # fmt: skip


def missing(why: str, *, model: str | None = None, server: str | None = None) -> TokenCapture:
    """A record of a call whose tokens could not be had, saying why."""
    return TokenCapture(model=model, server=server, why=why)


def ask(body: Mapping[str, Any], *, top_logprobs: int = 0) -> tuple[dict[str, Any], frozenset[str]]:
    """``body`` asking for token data too, and what of it the client did not ask for (to :func:`strip`)."""
    hidden = set()
    if not body.get("logprobs"):
        hidden.add(HIDDEN_LOGPROBS)
    if not body.get("return_token_ids"):
        hidden.add(HIDDEN_IDS)
    asked = {**body, **CAPTURE_FIELDS}
    if top_logprobs and not body.get("top_logprobs"):
        asked["top_logprobs"] = top_logprobs
    return asked, frozenset(hidden)


def read_reply(payload: Any, *, server: str | None = None) -> TokenCapture:
    """The tokens of a ``chat.completion`` (its first choice)."""
    if not isinstance(payload, dict):
        return missing("the reply was not a JSON object", server=server)
    choice = _first_choice(payload)
    prompt = _ids(payload.get("prompt_token_ids"))
    if prompt is None:
        prompt = _ids(choice.get("prompt_token_ids"))
    content = _content(choice)
    return _capture(payload, prompt, _ids(choice.get("token_ids")), content, server)


def read_events(events: Iterable[Any], *, server: str | None = None) -> TokenCapture:
    """The tokens of a streamed completion: its ``chat.completion.chunk`` documents, in order."""
    prompt: list[int] | None = None
    completion: list[int] | None = None
    content: list[dict[str, Any]] | None = None
    first: dict[str, Any] = {}
    for event in events:
        if not isinstance(event, dict):
            continue
        first = first or event
        if event.get("system_fingerprint"):
            first = {**first, "system_fingerprint": event["system_fingerprint"]}
        choice = _first_choice(event)
        if prompt is None:
            prompt = _ids(event.get("prompt_token_ids"))
            if prompt is None:
                prompt = _ids(choice.get("prompt_token_ids"))
        ids = _ids(choice.get("token_ids"))
        if ids is not None:
            completion = (completion or []) + ids
        entries = _content(choice)
        if entries is not None:
            content = (content or []) + entries
    return _capture(first, prompt, completion, content, server)


def strip(payload: Any, hidden: frozenset[str]) -> Any:
    """``payload`` (a completion or a chunk) without the token data the client did not ask for."""
    if not isinstance(payload, dict) or not hidden:
        return payload
    reply = dict(payload)
    if HIDDEN_IDS in hidden:
        reply.pop("prompt_token_ids", None)
    choices = reply.get("choices")
    if isinstance(choices, list):
        reply["choices"] = [_strip_choice(c, hidden) for c in choices]
    return reply


def atif_metrics(record: Mapping[str, Any]) -> dict[str, Any]:
    """A capture record (:meth:`TokenCapture.as_dict`) as ATIF step metrics: ``prompt_token_ids``,
    ``completion_token_ids`` and ``logprobs`` (ATIF v1.3-v1.4), the rest under ``extra``."""
    names = ("prompt_token_ids", "completion_token_ids", "logprobs")
    metrics = {name: record[name] for name in names if record.get(name) is not None}
    extra = {"response_model": record.get("model"), "model_version": record.get("model_version")}
    if record.get("why"):
        extra["tokens_missing"] = record["why"]
    return {**metrics, "extra": extra}


def _strip_choice(choice: Any, hidden: frozenset[str]) -> Any:
    if not isinstance(choice, dict):
        return choice
    choice = dict(choice)
    if HIDDEN_IDS in hidden:
        choice.pop("token_ids", None)
        choice.pop("prompt_token_ids", None)
    if HIDDEN_LOGPROBS in hidden and "logprobs" in choice:
        choice["logprobs"] = None
    return choice


def _capture(
    head: Mapping[str, Any],
    prompt: list[int] | None,
    completion: list[int] | None,
    content: list[dict[str, Any]] | None,
    server: str | None,
) -> TokenCapture:
    values = None if content is None else [e.get("logprob") for e in content]
    logprobs = (
        [float(v) for v in values if v is not None] if values is not None and all(map(_is_number, values)) else None
    )
    if completion is None and content is not None:
        completion = _ids([_token_id(e.get("token")) for e in content])
    gaps = [name for name, value in (("prompt token ids", prompt), ("completion token ids", completion),
                                     ("log-probabilities", logprobs)) if value is None]  # fmt: skip
    why = None
    if gaps:
        why = f"the upstream returned no {', '.join(gaps)} (vLLM and SGLang return them when asked; others do not)"
    elif completion is not None and logprobs is not None and len(completion) != len(logprobs):
        why = f"the upstream returned {len(completion)} completion token ids but {len(logprobs)} log-probabilities"
    model = head.get("model")
    fingerprint = head.get("system_fingerprint")
    return TokenCapture(
        prompt, completion, logprobs,
        model=str(model) if model is not None else None,
        system_fingerprint=str(fingerprint) if fingerprint is not None else None, server=server, why=why,
    )  # fmt: skip


def _first_choice(payload: Mapping[str, Any]) -> dict[str, Any]:
    choices = payload.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return {}


def _content(choice: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return None
    return [e for e in content if isinstance(e, dict)]


def _ids(value: Any) -> list[int] | None:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return list(value)


def _token_id(token: Any) -> int | None:
    """The id in vLLM's ``token_id:N`` rendering of a token; None for a token rendered as text."""
    if isinstance(token, str) and token.startswith(_TOKEN_ID_PREFIX) and token[len(_TOKEN_ID_PREFIX) :].isdigit():
        return int(token[len(_TOKEN_ID_PREFIX) :])
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def sse_documents(body: bytes) -> list[Any]:
    """The JSON documents of an event stream's ``data:`` lines (``[DONE]`` and non-JSON lines skipped)."""
    documents = []
    for line in body.splitlines():
        if line.startswith(b"data:"):
            try:
                documents.append(json.loads(line[5:].strip()))
            except (ValueError, UnicodeDecodeError):
                continue
    return documents
