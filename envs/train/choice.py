"""Guided choice decoding: the model writes one of a few given commands, token by token.

A randomly initialised model writes noise, and noise never passes a task's verifier, so every
reward would be 0 and GRPO would have nothing to learn from. The policy therefore samples from the
model's distribution restricted, at each token, to the tokens that continue one of the candidate
commands (a prefix tree over their token ids, each ending in ``<eos>``): the technique vLLM calls
guided choice. Where only one token continues a candidate it is taken without asking the model.

The log-probability recorded for each token is the model's own, over the whole vocabulary before
the restriction (vLLM's default, ``raw_logprobs``): the one the trainer recomputes from the same
weights, so the two agree while the weights have not moved.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pool.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Sample:
    """One command the model wrote."""

    text: str
    """The candidate it wrote, exactly as given."""
    token_ids: tuple[int, ...]
    """Its tokens, ``<eos>`` last."""
    logprobs: tuple[float, ...]
    """The model's log-probability of each token given everything before it (full vocabulary)."""


class ChoiceDecoder:
    """Samples a candidate from ``model`` given a context; one sample at a time (a lock), from any thread."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self._lock = threading.Lock()

    def sample(
        self, context_ids: Sequence[int], candidates: Sequence[str], *, generator: torch.Generator | None = None
    ) -> Sample:
        """Write one of ``candidates`` after ``context_ids``, drawing from ``generator`` (default: torch's).

        Raises:
            ConfigError: no candidates, or an empty one.
        """
        if not candidates or not all(candidates):
            raise ConfigError(f"guided choice needs non-empty candidate commands, got {list(candidates)!r}")
        eos = int(self.tokenizer.eos_token_id)
        encoded = [[*self.tokenizer.encode(text, add_special_tokens=False), eos] for text in candidates]
        with self._lock, torch.no_grad():
            chosen = self._walk(list(context_ids), encoded, generator)
            logprobs = self._logprobs(list(context_ids), chosen)
        text = candidates[encoded.index(chosen)]
        return Sample(text, tuple(chosen), tuple(logprobs))

    def _walk(self, context: list[int], encoded: list[list[int]], generator: torch.Generator | None) -> list[int]:
        chosen: list[int] = []
        live = encoded
        while not chosen or chosen[-1] != self.tokenizer.eos_token_id:
            options = sorted({ids[len(chosen)] for ids in live})
            token = options[0] if len(options) == 1 else self._draw(context + chosen, options, generator)
            chosen.append(token)
            live = [ids for ids in live if ids[len(chosen) - 1] == token]
        return chosen

    def _draw(self, prefix: list[int], options: list[int], generator: torch.Generator | None) -> int:
        logits = self._forward(prefix)[-1]
        allowed = logits[options]
        index = torch.multinomial(torch.softmax(allowed, dim=-1), 1, generator=generator)
        return options[int(index)]

    def _logprobs(self, context: list[int], chosen: list[int]) -> list[float]:
        logits = self._forward(context + chosen)[len(context) - 1 : -1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        return [float(x) for x in logprobs.gather(1, torch.tensor(chosen).unsqueeze(1)).squeeze(1)]

    def _forward(self, ids: list[int]) -> torch.Tensor:
        device = next(self.model.parameters()).device
        logits: torch.Tensor = self.model(torch.tensor([ids], device=device)).logits[0]
        return logits.cpu()
