"""TRL's ``rollout_func`` for ``GRPOTrainer``: snapgym episodes in, token ids, log-probabilities and rewards out.

``GRPOTrainer(rollout_func=...)`` hands the function the prompts of a generation batch, each repeated
``num_generations`` times in a row, and the trainer; it must return ``prompt_ids``, ``completion_ids``
and ``logprobs`` (one list per prompt), and every other key goes to the reward functions as a column.
Here each run of a repeated prompt (a task's instruction) is one ``envs.rollout`` group: ``k``
episodes forked from the task's snapshot and played at once by :class:`~envs.train.policy.TokenPolicy`
with the trainer's current model, each scored by the task's own verifier. Besides the three keys
it returns ``env_mask`` (TRL leaves the environment's tokens out of the loss) and ``env_reward``
(the verifier's reward, ``None`` for an episode the infrastructure failed, which TRL then leaves
out of its group's baseline), which :func:`env_reward` passes on as the reward.

No vLLM is needed: TRL calls ``rollout_func`` before and instead of its own generation, on whatever
device the model is on (read ``GRPOTrainer._generate``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import envs
from envs.rollout import Group
from envs.train.choice import ChoiceDecoder
from envs.train.policy import TokenEpisode, TokenPolicy
from pool.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RolloutCall:
    """What one call of the rollout played, in the order of the batch it returned."""

    groups: list[Group]
    """One ``envs.Group`` per run of equal prompts: its episodes, rewards and ATIF trajectories."""
    tokens: list[list[TokenEpisode]]
    """Per group, the token record of each of its episodes."""

    @property
    def episodes(self) -> list[TokenEpisode]:
        """Every episode's token record, in batch order."""
        return [record for group in self.tokens for record in group]

    @property
    def rewards(self) -> list[float]:
        """Every episode's verifier reward, in batch order (NaN: unscored)."""
        return [float(reward) for group in self.groups for reward in group.rewards]


class SnapgymRollout:
    """A ``rollout_func`` over ``env``'s tasks, the model choosing among ``commands[task_id]`` each step.

    :attr:`history` keeps what each call played (for inspection and logging).
    """

    def __init__(
        self,
        env: Any,
        tokenizer: Any,
        commands: Mapping[str, Sequence[str]],
        *,
        max_observation_chars: int = 256,
        seed: int = 0,
    ) -> None:
        tasks = env.unwrapped.tasks
        unknown = sorted(set(commands) - set(tasks))
        if unknown:
            raise ConfigError(f"commands name tasks {unknown} that the environment lacks: it has {sorted(tasks)}")
        self.env = env
        self.tokenizer = tokenizer
        self.commands = dict(commands)
        self.max_observation_chars = max_observation_chars
        self.task_of_prompt = {tasks[task_id].instruction: task_id for task_id in self.commands}
        """Each task's instruction (the dataset's prompt) -> its id."""
        self.seed = seed
        self.history: list[RolloutCall] = []
        """Every call, in order."""

    def prompts(self) -> list[dict[str, str]]:
        """The training dataset's rows: one per task, its instruction as ``prompt``."""
        return [{"prompt": prompt, "task_id": task_id} for prompt, task_id in self.task_of_prompt.items()]

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """Play one group of episodes per run of equal prompts; return TRL's columns, one entry per prompt.

        Raises:
            ConfigError: a prompt that is none of the tasks' instructions (before anything is played).
        """
        runs = [(self._task(prompt), len(list(run))) for prompt, run in groupby(prompts)]
        model = trainer.accelerator.unwrap_model(trainer.model)
        decoder = ChoiceDecoder(model, self.tokenizer)
        out: dict[str, list[Any]] = {key: [] for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask")}
        out["env_reward"] = []
        call = RolloutCall([], [])
        for number, (task_id, k) in enumerate(runs):
            menu = {task_id: self.commands[task_id]}
            seed = (self.seed, len(self.history), number)  # per call and group: a rerun draws the same
            policy = TokenPolicy(decoder, menu, max_observation_chars=self.max_observation_chars, seed=seed)
            [group] = envs.rollout(self.env, policy, k=k, tasks=[task_id])
            tokens = [policy.episodes[index] for index in range(len(group.episodes))]
            for episode, record in zip(group.episodes, tokens, strict=True):
                out["prompt_ids"].append(record.prompt_ids)
                out["completion_ids"].append(record.completion_ids)
                out["logprobs"].append(record.logprobs)
                out["env_mask"].append(record.env_mask)
                out["env_reward"].append(episode.reward if episode.scored else None)
            call.groups.append(group)
            call.tokens.append(tokens)
        self.history.append(call)
        return out

    def _task(self, prompt: Any) -> str:
        task_id = self.task_of_prompt.get(prompt) if isinstance(prompt, str) else None
        if task_id is None:
            raise ConfigError(
                f"prompt {str(prompt)[:80]!r} is no task's instruction: build the dataset from SnapgymRollout.prompts()"
            )
        return task_id


def env_reward(completions: list[Any], env_reward: list[float | None], **_: Any) -> list[float | None]:
    """TRL reward function: each episode's reward from its task's verifier, as the rollout returned it."""
    if len(env_reward) != len(completions):
        raise ConfigError(f"{len(completions)} completions but {len(env_reward)} env_reward values")
    return list(env_reward)
