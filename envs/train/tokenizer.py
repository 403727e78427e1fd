"""A byte-level tokenizer built in code: 256 byte tokens and two special ones, nothing downloaded.

Every text has an encoding (any byte is a token) and decodes back to itself, so shell commands and
command output of any kind round-trip; with no merges the vocabulary stays at 258 tokens, which
keeps a model built on it tiny.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD = "<pad>"
EOS = "<eos>"


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A Transformers tokenizer over bytes (ids 0-255), ``<pad>`` (256) and ``<eos>`` (257), padding on the
    left as TRL's GRPOTrainer requires."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    vocab[PAD], vocab[EOS] = len(alphabet), len(alphabet) + 1
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    fast: Any = PreTrainedTokenizerFast  # untyped in Transformers 5: called through Any
    tokenizer: PreTrainedTokenizerFast = fast(tokenizer_object=core, eos_token=EOS, pad_token=PAD, padding_side="left")
    return tokenizer
