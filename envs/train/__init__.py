"""Train a language model on snapgym episodes with a real RL library: TRL's ``GRPOTrainer``.

>>> from envs.train import example
>>> result = example.train(example.TrainConfig(steps=3))   # a tiny random model, built-in tasks, on a CPU

The pieces, one idea each: :mod:`.tokenizer` (a byte-level tokenizer built in code, no download),
:mod:`.model` (a tiny randomly initialised causal LM from a config), :mod:`.choice` (guided choice
decoding: the model writes one of a few commands, with its own log-probabilities), :mod:`.policy`
(a rollout policy that records every episode's token ids, log-probabilities and which tokens the
environment wrote), :mod:`.trl_rollout` (TRL's ``rollout_func``: groups of snapgym episodes in,
token ids, log-probabilities and verifier rewards out) and :mod:`.example` (the trainer, end to end).

This package needs the ``train`` extra (``pip install 'snapgym[train]'``: PyTorch, Transformers,
TRL, Datasets), which nothing else in snapgym uses. See docs/training.md.
"""

from __future__ import annotations

from pool.errors import ConfigError

TRAIN_INSTALL_HINT = "pip install 'snapgym[train]'"

try:
    import datasets  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401
except ImportError as error:  # one line that says what to install, not a traceback into torch
    raise ConfigError(f"envs.train needs the train extra ({error.name} is missing): {TRAIN_INSTALL_HINT}") from error

__all__ = ["TRAIN_INSTALL_HINT"]
