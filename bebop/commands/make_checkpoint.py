"""`bebop make-checkpoint`: a small random-init Hugging Face checkpoint with a BPE chat tokenizer, made offline.

    bebop make-checkpoint runs/my-qwen3 --family qwen3
    bebop train-mtp --policy runs/my-qwen3 ...

What a real checkpoint brings and the embedded default does not, in a few megabytes: a `transformers` model of
a supported family (`qwen3` tied, `qwen2` with q/k/v bias, `llama` with Llama-3 rope scaling), saved by
`transformers` itself; a byte-level BPE tokenizer (trained by `tokenizers` on bebop's own task texts) whose
EOS is ChatML's `<|im_end|>`, with a ChatML chat template; and embedding rows padded past the tokenizer, as
Qwen3 pads 151,669 tokens to 151,936. So every path a user's model takes (chat template, multi-token stop
strings, padding ids that must never be sampled) runs here without a model hub. Its weights are random: it
writes gibberish, and its rewards are 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

FAMILIES = ("qwen3", "qwen2", "llama")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
ROW_MULTIPLE = 64  # embedding rows are rounded up past the tokenizer, as real checkpoints pad theirs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", type=Path, help="directory to create (must not exist or be empty)")
    parser.add_argument("--family", choices=FAMILIES, default="qwen3", help="model family (default: %(default)s)")
    parser.add_argument("--vocab", type=int, default=1024, help="BPE vocabulary to train (default: %(default)s)")
    parser.add_argument("--hidden-size", type=int, default=128, help="(default: %(default)s)")
    parser.add_argument("--layers", type=int, default=2, help="(default: %(default)s)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="stored dtype (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default: %(default)s)")


def task_corpus(per_task: int = 64, seed: int = 0) -> list[str]:
    """Prompts and demonstrations of bebop's built-in tasks: what the tokenizer should encode compactly."""
    import torch

    from bebop.data import tasks

    texts = []
    for name in sorted(tasks.TASKS):
        task = tasks.get(name)
        generator = torch.Generator().manual_seed(seed)
        for example in task.sample(per_task, seed):
            texts.append(example.prompt + task.demonstration(example, generator))
    return texts


def train_tokenizer(texts: list[str], vocab: int):
    """A byte-level BPE `PreTrainedTokenizerFast` (every text encodes) with ChatML specials and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE)


def hf_config(family: str, vocab_rows: int, hidden: int, layers: int, eos_id: int, pad_id: int):
    """The transformers config of `family` at a small width (4 heads, 2 KV heads)."""
    import transformers

    shape = dict(vocab_size=vocab_rows, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=4096,
                 eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None)
    if family == "qwen3":
        return transformers.Qwen3Config(**shape, tie_word_embeddings=True)
    if family == "qwen2":
        return transformers.Qwen2Config(**shape, tie_word_embeddings=False)
    rope = {"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}
    return transformers.LlamaConfig(**shape, tie_word_embeddings=True, rope_parameters=rope)


def run(args: argparse.Namespace) -> int:
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise FileExistsError(f"{args.out} exists and is not an empty directory")
    for flag, value, least in (("--vocab", args.vocab, 300), ("--hidden-size", args.hidden_size, 8),
                               ("--layers", args.layers, 1)):
        if value < least:
            raise ValueError(f"{flag} must be >= {least}, got {value}")
    if args.hidden_size % 8:
        raise ValueError(f"--hidden-size must be a multiple of 8 (4 heads of even size), got {args.hidden_size}")
    import torch
    import transformers

    tokenizer = train_tokenizer(task_corpus(), args.vocab)
    rows = -(-len(tokenizer) // ROW_MULTIPLE) * ROW_MULTIPLE + ROW_MULTIPLE
    config = hf_config(args.family, rows, args.hidden_size, args.layers, tokenizer.eos_token_id,
                       tokenizer.pad_token_id)
    torch.manual_seed(args.seed)  # transformers initialises through the global generator
    model = transformers.AutoModelForCausalLM.from_config(config)
    model = model.to(torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"wrote {args.family} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{rows} embedding rows for {len(tokenizer)} tokens, {args.dtype}) to {args.out}")
    return 0
