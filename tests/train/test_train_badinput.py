"""The trainer example's pieces refuse bad input in one line that names the problem (no sandbox, no training)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pool.errors import ConfigError
from tests.support.needs import needs

REPO = Path(__file__).resolve().parents[2]
needs_train = needs(importlib.util.find_spec("trl") is None, "the train extra is missing: pip install '.[train]'")


def test_without_the_extra_envs_train_says_what_to_install() -> None:
    code = "import sys; sys.modules['trl'] = None\nimport envs.train"  # trl as if not installed
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    hint = "envs.train needs the train extra (trl is missing): pip install 'snapgym[train]'"
    assert last == f"pool.errors.ConfigError: {hint}"


class _Tasks:
    """Just what SnapgymRollout reads of an environment: ``env.unwrapped.tasks``."""

    def __init__(self, tasks: dict[str, Any]) -> None:
        self.tasks = tasks
        self.unwrapped = self


@needs_train
def test_the_rollout_refuses_commands_for_tasks_the_environment_lacks() -> None:
    import envs
    from envs.train.tokenizer import byte_tokenizer
    from envs.train.trl_rollout import SnapgymRollout

    env = _Tasks({"top-ips": envs.load_task("top-ips")})
    with pytest.raises(ConfigError, match=r"commands name tasks \['log-error-count'\] that the environment lacks"):
        SnapgymRollout(env, byte_tokenizer(), {"log-error-count": ["true"]})
    rollout = SnapgymRollout(env, byte_tokenizer(), {"top-ips": ["true"]})
    assert rollout.prompts() == [{"prompt": envs.load_task("top-ips").instruction, "task_id": "top-ips"}]
    with pytest.raises(ConfigError, match=r"is no task's instruction: build the dataset from SnapgymRollout\.prompts"):
        rollout(["solve it"] * 4, trainer=None)  # refused before any model or sandbox is touched


@needs_train
def test_guided_choice_refuses_an_empty_menu_and_writes_only_its_candidates() -> None:
    import torch

    from envs.train.choice import ChoiceDecoder
    from envs.train.model import tiny_causal_lm
    from envs.train.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    decoder = ChoiceDecoder(tiny_causal_lm(tokenizer), tokenizer)
    context = tokenizer.encode("count the lines")
    for bad in ([], ["ls", ""]):
        with pytest.raises(ConfigError, match="guided choice needs non-empty candidate commands"):
            decoder.sample(context, bad)
    menu = ["wc -l a.txt", "wc -l b.txt", "submit", "é ✓"]
    samples = [decoder.sample(context, menu, generator=torch.Generator().manual_seed(i)) for i in range(12)]
    assert {s.text for s in samples} <= set(menu) and len({s.text for s in samples}) > 1
    for sample in samples:
        assert tokenizer.decode(sample.token_ids, skip_special_tokens=True) == sample.text
        assert sample.token_ids[-1] == tokenizer.eos_token_id and len(sample.logprobs) == len(sample.token_ids)
        assert all(lp < 0 for lp in sample.logprobs)


@needs_train
def test_the_tokenizer_round_trips_any_text() -> None:
    from envs.train.tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer()
    text = "awk '{ print $1 }' | sort\n\x00 é ✓ [stderr]\t"
    ids = tokenizer.encode(text)
    assert len(ids) == len(text.encode()) and max(ids) < 256
    assert tokenizer.decode(ids) == text
    assert (len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id) == (258, 256, 257)
    assert tokenizer.padding_side == "left"
