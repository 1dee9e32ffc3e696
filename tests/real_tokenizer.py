"""Test helpers for a real-tokenizer world: a Qwen-like BPE tokenizer and a tiny model steered to write given text.

`make_bpe_tokenizer(dir)` trains a byte-level BPE on bebop's own task texts (no downloads), with the chat specials
`<|im_start|>`, `<|im_end|>` (EOS), `<|endoftext|>` (pad), `<call>` as one added token (as Qwen has `<tool_call>`)
while `</call>` stays several tokens, and a Qwen-like chat template; saved by transformers' `PreTrainedTokenizerFast`.

`steered_pair(vocab, transitions)` is `bebop.models.selfdraft`'s target/draft pair (the next-token distribution
depends on the current token only, and the head drafts exactly what the target would) with its LM head set so that
token t is followed by transitions[t] with probability ~1: a policy that writes a chosen text, speculatively too.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def training_texts() -> list[str]:
    from bebop.data import tasks

    texts, generator = [], torch.Generator().manual_seed(0)
    for name in ("math", "agent"):
        task = tasks.get(name)
        for example in task.sample(24, seed=1):
            texts.append(example.prompt + task.demonstration(example, generator))
    return texts + ["answer: 42", "<call>calc 1+2</call><result>3</result>"]


def make_bpe_tokenizer(path: Path, *, chat_template: bool = True) -> Path:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(training_texts(), trainer)
    backend.add_tokens([AddedToken("<call>", special=False, normalized=False)])
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    if chat_template:
        hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(str(path))
    return path


def steered_pair(vocab_size: int, transitions: dict[int, int], *, padding_from: int | None = None,
                 strength: float = 60.0):
    """(target, head) where token t is followed by transitions[t]; tokens not in `transitions` have a uniform next
    token. With `padding_from`, ids >= padding_from get twice the steered logit after every steered token: the
    padding rows a vocab_limit must mask."""
    from bebop.models.config import ModelConfig
    from bebop.models.selfdraft import self_draft_pair

    config = ModelConfig.tiny(vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=32, tie_word_embeddings=False)
    model, head = self_draft_pair(config, seed=0)
    d = config.hidden_size
    with torch.no_grad():
        model.model.norm.weight.fill_(1.0)
        head.norm.weight.fill_(1.0)
        embed = model.model.embed_tokens.weight  # [V, d]
        unit = embed / embed.norm(dim=-1, keepdim=True)  # the direction of norm(Emb(t)), whose norm is sqrt(d)
        lm_head = torch.zeros_like(model.lm_head.weight)  # [V, d]
        for t, s in transitions.items():
            lm_head[s] += strength * unit[t] / d**0.5
        if padding_from is not None:
            lm_head[padding_from:] = 2 * strength * unit[list(transitions)].sum(0) / d**0.5
        model.lm_head.weight.copy_(lm_head)
    return model, head


def chain(start: int, ids: list[int], end: int) -> dict[int, int]:
    """Transitions that write `ids` after token `start`, then `end`; the ids must be distinct (and not `start`)."""
    path = [start, *ids, end]
    assert len(set(path[:-1])) == len(path) - 1, f"a steered path needs distinct tokens, got {path}"
    return dict(itertools.pairwise(path))
