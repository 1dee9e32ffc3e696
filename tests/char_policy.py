"""The smallest policy a head trains on in seconds: a character tokenizer and a 32-wide model over it."""

from __future__ import annotations

import torch

from bebop.data.tokenizer import CharTokenizer
from bebop.models.config import ModelConfig
from bebop.models.transformer import Transformer


def char_policy(num_hidden_layers: int, seed: int = 0) -> tuple[Transformer, CharTokenizer]:
    """(a random model of `num_hidden_layers` layers in eval mode, its tokenizer), seeded."""
    torch.manual_seed(seed)
    tokenizer = CharTokenizer()
    config = ModelConfig.tiny(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=num_hidden_layers, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=16)
    return Transformer(config).eval(), tokenizer
