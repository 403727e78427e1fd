"""The example, end to end: TRL's GRPOTrainer trains a tiny random Llama on snapgym episodes, on a CPU.

    python -m envs.train.example            # 3 steps on two built-in tasks, about a minute

Each training step plays a group of ``group_size`` episodes per task (sandboxes forked from the
task's snapshot, played at once), the model choosing each step's command among the task's reference
solution, near-misses its verifier rejects and ``submit``; the verifier's reward of each episode is
the reward, and GRPO's loss is taken over the tokens the model wrote.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer

import envs
from envs.train.model import tiny_causal_lm
from envs.train.tokenizer import byte_tokenizer
from envs.train.trl_rollout import SnapgymRollout, env_reward

COUNT_5XX = """awk '{ split($0, p, "\\""); split(p[3], f, " "); if (f[1] ~ /^5/) n++ } END { print n+0 }'"""
TOP_IPS = "awk '{ print $1 }' /app/access.log | sort | uniq -c | sort -k1,1nr | head -n 3"
COMMANDS: Mapping[str, Sequence[str]] = {
    "log-error-count": (
        f"{COUNT_5XX} /app/access.log > /app/answer.txt",  # the reference solution
        f"{COUNT_5XX} /app/access.log",  # the count printed, not written
        """grep -c '" 500 ' /app/access.log > /app/answer.txt""",  # status 500 only, not every 5xx
    ),
    "top-ips": (
        f"{TOP_IPS} | awk '{{ print $2 }}' > /app/top_ips.txt",  # the reference solution
        f"{TOP_IPS} > /app/top_ips.txt",  # the counts left in
    ),
}
"""Per built-in task, the commands the model chooses among (``submit`` is added): one solves the task."""


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """What the example trains, and how long."""

    commands: Mapping[str, Sequence[str]] = field(default_factory=lambda: dict(COMMANDS))
    """Task id -> the commands the model may write in its episodes (its action menu)."""
    steps: int = 3
    """Optimizer steps; each plays one group per task."""
    group_size: int = 4
    """Episodes per task and step (GRPO's ``num_generations``)."""
    max_turns: int = 3
    """Commands per episode before the environment ends it (``max_steps``) and the verifier scores it."""
    learning_rate: float = 1e-3
    seed: int = 0
    output_dir: str | None = None
    """Where TRL writes its run folder (default: a temporary one)."""


@dataclass(frozen=True, slots=True)
class TrainResult:
    """What a run did."""

    log_history: list[dict[str, Any]]
    """TRL's per-step logs (``loss``, ``reward``, ``reward_std``, ...)."""
    rewards: list[list[float]]
    """Per generation batch, the verifier reward of each of its episodes (NaN: unscored)."""


def make_trainer(
    config: TrainConfig, env: Any, *, trainer_class: type[GRPOTrainer] = GRPOTrainer, callbacks: Sequence[Any] = ()
) -> tuple[GRPOTrainer, SnapgymRollout]:
    """A ``GRPOTrainer`` (or ``trainer_class``, a subclass) whose rollouts are episodes of ``env``, and its rollout."""
    tokenizer = byte_tokenizer()
    model = tiny_causal_lm(tokenizer, seed=config.seed)
    rollout = SnapgymRollout(env, tokenizer, config.commands, seed=config.seed)
    args = GRPOConfig(
        output_dir=config.output_dir or tempfile.mkdtemp(prefix="snapgym-grpo-"),
        max_steps=config.steps,
        num_generations=config.group_size,
        per_device_train_batch_size=config.group_size * len(config.commands),  # one group per task a step
        learning_rate=config.learning_rate,
        seed=config.seed,
        use_cpu=True,
        bf16=False,  # TRL's default autocasts to bfloat16: float32 keeps the sampled log-probabilities exact
        gradient_checkpointing=False,  # TRL's default; a model this small has nothing to save
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    trainer = trainer_class(
        model=model,
        reward_funcs=env_reward,
        args=args,
        train_dataset=Dataset.from_list(rollout.prompts()),
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=list(callbacks),
    )
    return trainer, rollout


def train(config: TrainConfig | None = None) -> TrainResult:
    """Train the tiny model for ``config.steps`` steps on snapgym episodes of ``config.commands``' tasks."""
    config = config or TrainConfig()
    env = envs.ShellEnv(tasks=sorted(config.commands), max_steps=config.max_turns)
    try:
        trainer, rollout = make_trainer(config, env)
        trainer.train()
    finally:
        env.close()
    rewards = [call.rewards for call in rollout.history]
    return TrainResult(list(trainer.state.log_history), rewards)


def main() -> None:
    """Run the example with its defaults and print what each step did."""
    result = train()
    for step, (logs, rewards) in enumerate(zip(result.log_history, result.rewards, strict=False), start=1):
        print(f"step {step}: loss {logs.get('loss')}, mean reward {logs.get('reward')}, episodes' rewards {rewards}")


if __name__ == "__main__":
    main()
