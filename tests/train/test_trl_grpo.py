"""TRL's GRPOTrainer trains a tiny random model on snapgym episodes: the example of docs/training.md.

One short run (three optimizer steps, two built-in tasks, a group of four forked episodes per task
and step) of :func:`envs.train.example.make_trainer`, with a subclass of TRL's trainer that keeps
every batch its ``_generate_and_score_completions`` builds and recomputes, with the weights the
episodes were just played with, the model's log-probability of every token. Needs the ``train`` extra.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import numpy as np
import pytest

from tests.support.needs import needs

pytestmark = needs(importlib.util.find_spec("trl") is None, "the train extra is not installed: pip install '.[train]'")

TASKS = ("log-error-count", "top-ips")
STEPS = 3
GROUP = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The trained run: its trainer, its rollout, each batch TRL built, and the parameters that moved."""
    import torch
    from trl.trainer.grpo_trainer import GRPOTrainer

    import envs
    from envs.train.example import COMMANDS, TrainConfig, make_trainer

    kept: list[dict[str, Any]] = []

    class RecordingTrainer(GRPOTrainer):  # type: ignore[misc]
        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            batch: dict[str, Any] = super()._generate_and_score_completions(inputs)
            kept.append({"batch": batch, "recomputed": recompute(self.model, rollout.history[-1].episodes)})
            return batch

    config = TrainConfig(
        commands={task: COMMANDS[task] for task in TASKS},
        steps=STEPS,
        group_size=GROUP,
        output_dir=str(tmp_path_factory.mktemp("grpo")),
    )
    env = envs.ShellEnv(tasks=list(TASKS), max_steps=config.max_turns)
    try:
        trainer, rollout = make_trainer(config, env, trainer_class=RecordingTrainer)
        before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
        trainer.train()
    finally:
        env.close()
    moved = [name for name, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[name])]
    return {"trainer": trainer, "rollout": rollout, "kept": kept, "moved": moved}


def recompute(model: Any, episodes: list[Any]) -> list[list[float]]:
    """Per episode, the model's log-probability of each completion token given all before it (no padding)."""
    import torch

    out = []
    with torch.no_grad():
        for episode in episodes:
            start = len(episode.prompt_ids)
            ids = torch.tensor([episode.prompt_ids + episode.completion_ids])
            logps = torch.log_softmax(model(ids).logits[0, start - 1 : -1].float(), dim=-1)
            out.append([float(x) for x in logps.gather(1, ids[0, start:].unsqueeze(1)).squeeze(1)])
    return out


def unpad(rows: Any, mask: Any) -> list[list[Any]]:
    """The rows of a padded batch tensor, without their padding."""
    pairs = zip(rows.tolist(), mask.tolist(), strict=True)
    return [[x for x, keep in zip(row, keeps, strict=True) if keep] for row, keeps in pairs]


def written(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of tokens the model wrote (``env_mask`` 1), one per action."""
    runs: list[list[int]] = []
    previous = 0
    for token, by_model in zip(ids, mask, strict=True):
        if by_model and not previous:
            runs.append([])
        if by_model:
            runs[-1].append(token)
        previous = by_model
    return runs


def test_the_trainer_steps_and_the_weights_move(run: dict[str, Any]) -> None:
    trainer = run["trainer"]
    assert trainer.state.global_step == STEPS
    losses = [float(logs["loss"]) for logs in trainer.state.log_history if "loss" in logs and "reward" in logs]
    assert len(losses) == STEPS and all(math.isfinite(loss) for loss in losses), losses
    assert run["moved"], f"no parameter changed in {STEPS} GRPO steps"


def test_the_batch_holds_the_token_ids_and_logprobs_the_episodes_recorded(run: dict[str, Any]) -> None:
    tokenizer = run["trainer"].processing_class
    assert len(run["kept"]) == len(run["rollout"].history) == STEPS
    for kept, call in zip(run["kept"], run["rollout"].history, strict=True):
        batch, records = kept["batch"], call.episodes
        assert sorted(group.task_id for group in call.groups) == sorted(TASKS) and len(records) == GROUP * len(TASKS)
        assert unpad(batch["prompt_ids"], batch["prompt_mask"]) == [r.prompt_ids for r in records]
        assert unpad(batch["completion_ids"], batch["completion_mask"]) == [r.completion_ids for r in records]
        assert unpad(batch["tool_mask"], batch["completion_mask"]) == [r.env_mask for r in records]
        logprobs = unpad(batch["sampling_per_token_logps"], batch["completion_mask"])
        for got, record in zip(logprobs, records, strict=True):
            assert np.allclose(got, record.logprobs, atol=1e-6)
        for record in records:  # what the environment ran is what the model's tokens say, each ending at <eos>
            runs = written(record.completion_ids, record.env_mask)
            assert [tokenizer.decode(ids[:-1]) for ids in runs] == record.actions
            assert all(ids[-1] == tokenizer.eos_token_id for ids in runs)
            assert record.prompt_ids == tokenizer.encode(run["rollout"].env.unwrapped.tasks[record.task_id].instruction)


def test_the_logprobs_are_the_models_own(run: dict[str, Any]) -> None:
    """Each written token's log-probability is the model's, with the weights the episode was played with."""
    for kept, call in zip(run["kept"], run["rollout"].history, strict=True):
        for recomputed, record in zip(kept["recomputed"], call.episodes, strict=True):
            mask = record.env_mask
            mine = [lp for lp, by_model in zip(record.logprobs, mask, strict=True) if by_model]
            model = [lp for lp, by_model in zip(recomputed, mask, strict=True) if by_model]
            assert np.allclose(mine, model, atol=1e-5), (mine[:5], model[:5])
            assert all(lp == 0.0 for lp, by_model in zip(record.logprobs, mask, strict=True) if not by_model)


def test_the_rewards_are_the_verifiers_of_snapgym_episodes(run: dict[str, Any]) -> None:
    """Every episode started at its task's fork point and was scored by its verifier; TRL's reward and advantages
    are those rewards."""
    logged = [logs for logs in run["trainer"].state.log_history if "reward" in logs]
    seen: set[float] = set()
    for kept, call, logs in zip(run["kept"], run["rollout"].history, logged, strict=True):
        for group in call.groups:
            assert len({episode.infos[0]["start_digest"] for episode in group.episodes}) == 1
            for episode in group.episodes:
                assert episode.infos[0]["started_at"] == "fork" and episode.scored
                assert "verifier" in episode.infos[-1] and episode.reward == episode.rewards[-1]
                assert len(episode.trajectory["steps"]) == len(episode.actions) + 1
        rewards = np.array(call.rewards)
        seen.update(rewards.tolist())
        assert float(logs["reward"]) == pytest.approx(float(rewards.mean()))
        advantages = np.array(kept["batch"]["advantages"].tolist())
        for start in range(0, len(rewards), GROUP):
            r, a = rewards[start : start + GROUP], advantages[start : start + GROUP]
            assert np.array_equal(np.sign(np.round(a, 6)), np.sign(r - r.mean())), (r, a)
    assert seen == {0.0, 1.0}, "every episode scored alike: GRPO had nothing to learn from"
