"""A snapgym rollout policy that is a language model, recording each episode as a trainer takes it.

``envs.rollout`` calls ``policy(observation, info)`` once per step of each episode, from one thread
per episode. This one writes each action with :class:`~envs.train.choice.ChoiceDecoder` and keeps,
per episode (``info["rollout_index"]``), the token ids the model saw and wrote: the prompt is the
task's instruction (the reset's observation); the completion interleaves the model's actions with
the environment's observations, and ``env_mask`` tells them apart (1: the model wrote the token and
it is trained on; 0: the environment did, as TRL's ``env_mask`` expects). Nothing is retokenised
afterwards: the ids are the ones the model was given and sampled.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from envs.spaces.actions import SUBMIT
from envs.train.choice import ChoiceDecoder
from pool.errors import ConfigError


@dataclass(slots=True)
class TokenEpisode:
    """One episode's tokens."""

    task_id: str
    prompt_ids: list[int]
    """The instruction, as the model read it."""
    completion_ids: list[int] = field(default_factory=list)
    """The model's actions and, between them, the environment's observations."""
    logprobs: list[float] = field(default_factory=list)
    """Per completion token: the model's log-probability of it (0.0 for the environment's tokens)."""
    env_mask: list[int] = field(default_factory=list)
    """Per completion token: 1 where the model wrote it, 0 where the environment did."""
    actions: list[str] = field(default_factory=list)
    generator: torch.Generator = field(default_factory=torch.Generator, repr=False)
    """Where this episode's samples are drawn from (seeded per episode: a rerun draws the same)."""

    def add(self, token_ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        """Append tokens: the model's (with their ``logprobs``) or the environment's (``None``)."""
        self.completion_ids.extend(token_ids)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(token_ids))
        self.env_mask.extend([1 if logprobs is not None else 0] * len(token_ids))


class TokenPolicy:
    """``policy(observation, info) -> action`` for ``envs.rollout``, choosing among each task's ``commands``
    (``submit`` is always one of them) and recording :attr:`episodes`. Each episode draws from its own
    generator, seeded by ``seed`` and its rollout index, so the threads' order does not change the draws."""

    def __init__(
        self,
        decoder: ChoiceDecoder,
        commands: Mapping[str, Sequence[str]],
        *,
        max_observation_chars: int = 256,
        seed: Sequence[int] = (0,),
    ) -> None:
        if max_observation_chars < 1:
            raise ConfigError(f"max_observation_chars must be positive, got {max_observation_chars}")
        self.decoder = decoder
        self.commands = {task: [*dict.fromkeys([*menu, SUBMIT])] for task, menu in commands.items()}
        self.max_observation_chars = max_observation_chars
        self.seed = tuple(seed)
        self.episodes: dict[int, TokenEpisode] = {}
        """rollout index -> that episode's tokens."""
        self._lock = threading.Lock()

    def __call__(self, observation: dict[str, Any], info: dict[str, Any]) -> str:
        index = int(info["rollout_index"])
        if "step" not in info:  # the reset: the instruction is the prompt
            episode = TokenEpisode(info["task_id"], self._encode(observation["output"]))
            episode.generator.manual_seed(int(np.random.SeedSequence([*self.seed, index]).generate_state(1)[0]))
            with self._lock:
                self.episodes[index] = episode
        else:
            episode = self.episodes[index]
            episode.add(self._encode(f"\n{observation['output'][: self.max_observation_chars]}\n"), None)
        menu = self.commands.get(episode.task_id)
        if menu is None:
            raise ConfigError(f"no commands for task {episode.task_id!r}: the policy has {sorted(self.commands)}")
        sample = self.decoder.sample(episode.prompt_ids + episode.completion_ids, menu, generator=episode.generator)
        episode.add(sample.token_ids, sample.logprobs)
        episode.actions.append(sample.text)
        return sample.text

    def _encode(self, text: str) -> list[int]:
        return list(self.decoder.tokenizer.encode(text, add_special_tokens=False))
