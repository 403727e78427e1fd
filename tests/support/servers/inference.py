"""What an inference server (vLLM, SGLang) adds to a chat completion when asked: token ids and log-probabilities.

Stdlib only: ``model_server.py`` (run as a script in the test internet's namespace) and
``chat_server.py`` (in the test's process) both answer through it. The format is vLLM's
(``vllm/entrypoints/openai/chat_completion/protocol.py``):

- ``logprobs: true`` (``top_logprobs: N``): ``choices[].logprobs.content[]``, one entry per completion
  token, ``{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]}``;
  ``return_tokens_as_token_ids: true`` renders each token as ``"token_id:N"``;
- ``return_token_ids: true``: the prompt's ids in ``prompt_token_ids`` at the top of the reply and the
  completion's in ``choices[].token_ids``; streaming, ``prompt_token_ids`` comes in the first chunk and
  each chunk's choice carries the ids (and logprobs) of the tokens it adds.

The tokens are made up (a piece of text of up to four characters is a token; its id is drawn at
random, as are the log-probabilities), so nothing but the reply itself can tell what was sent: a test
compares what was recorded with :class:`Sampled`, which the server keeps of every reply.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

VOCABULARY = 151_000
PIECE_CHARS = 4


@dataclass(frozen=True, slots=True)
class Sampled:
    """The tokens of one reply: what the server sent (or would send, when asked)."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    pieces: list[str]
    """The completion's text, token by token."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the pieces left out)."""
        return {"prompt_token_ids": self.prompt_token_ids, "completion_token_ids": self.completion_token_ids,
                "logprobs": self.logprobs}  # fmt: skip


def sample(request: Any, completion_text: str, rng: random.Random | None = None) -> Sampled:
    """Made-up tokens for a request and the text it is answered with."""
    rng = rng or random.Random()
    prompt_text = json.dumps(request.get("messages") if isinstance(request, dict) else None)
    pieces = [completion_text[i : i + PIECE_CHARS] for i in range(0, len(completion_text), PIECE_CHARS)] or [""]
    prompt_pieces = max(1, len(prompt_text) // PIECE_CHARS)
    return Sampled(
        prompt_token_ids=[rng.randrange(VOCABULARY) for _ in range(prompt_pieces)],
        completion_token_ids=[rng.randrange(VOCABULARY) for _ in pieces],
        logprobs=[round(-rng.random() * 5, 6) for _ in pieces],
        pieces=pieces,
    )


def asks_for_ids(request: Any) -> bool:
    """Whether the request says ``return_token_ids: true``."""
    return isinstance(request, dict) and bool(request.get("return_token_ids"))


def asks_for_logprobs(request: Any) -> bool:
    """Whether the request says ``logprobs: true``."""
    return isinstance(request, dict) and bool(request.get("logprobs"))


def decorate(reply: dict[str, Any], request: Any, sampled: Sampled) -> dict[str, Any]:
    """A ``chat.completion`` with what ``request`` asked for of ``sampled`` added, as vLLM adds it."""
    reply = dict(reply)
    choice = dict(reply["choices"][0])
    if asks_for_logprobs(request):
        choice["logprobs"] = {"content": _entries(request, sampled, 0, len(sampled.pieces))}
    if asks_for_ids(request):
        reply["prompt_token_ids"] = sampled.prompt_token_ids
        choice["token_ids"] = sampled.completion_token_ids
    reply["choices"] = [choice, *reply["choices"][1:]]
    return reply


def decorate_chunk(chunk: dict[str, Any], request: Any, sampled: Sampled, start: int, end: int) -> dict[str, Any]:
    """A ``chat.completion.chunk`` adding tokens ``start:end`` of ``sampled`` (the first also carries the prompt's
    ids, as vLLM sends them)."""
    chunk = dict(chunk)
    choice = dict(chunk["choices"][0])
    if asks_for_logprobs(request) and end > start:
        choice["logprobs"] = {"content": _entries(request, sampled, start, end)}
    if asks_for_ids(request):
        if start == 0:
            chunk["prompt_token_ids"] = sampled.prompt_token_ids
        choice["token_ids"] = sampled.completion_token_ids[start:end]
    chunk["choices"] = [choice]
    return chunk


def _entries(request: dict[str, Any], sampled: Sampled, start: int, end: int) -> list[dict[str, Any]]:
    top = max(0, min(int(request.get("top_logprobs") or 0), 20))
    as_ids = bool(request.get("return_tokens_as_token_ids"))
    entries = []
    for index in range(start, end):
        token_id, logprob, piece = sampled.completion_token_ids[index], sampled.logprobs[index], sampled.pieces[index]
        token = f"token_id:{token_id}" if as_ids else piece
        alternatives = [{"token": token, "logprob": logprob, "bytes": list(piece.encode())}]
        for rank in range(1, top):
            other = (token_id + rank) % VOCABULARY
            text = f"<{other}>"
            alternatives.append({"token": f"token_id:{other}" if as_ids else text, "logprob": round(logprob - rank, 6),
                                 "bytes": list(text.encode())})  # fmt: skip
        entries.append({**alternatives[0], "top_logprobs": alternatives[:top]})
    return entries
