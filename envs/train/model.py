"""A tiny causal language model, randomly initialised from a config: a real Llama, two layers deep."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase


def tiny_causal_lm(
    tokenizer: PreTrainedTokenizerBase, *, layers: int = 2, hidden_size: int = 64, seed: int = 0
) -> LlamaForCausalLM:
    """A ``LlamaForCausalLM`` with ``layers`` decoder layers of width ``hidden_size`` over ``tokenizer``'s
    vocabulary, its weights drawn from ``seed`` (about 115 thousand parameters at the defaults)."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)
