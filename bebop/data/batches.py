"""Demonstrations as token tensors for `bebop pretrain`.

`demo_batches` streams demonstrations (`task.demonstration`, some deliberately wrong). A sequence is
`prompt + solution + EOS`; only solution tokens the policy itself would write carry loss (`loss_mask`):
not the prompt, and not agent tool replies (`tool_mask`), which the environment writes. Examples are
drawn a few batches at a time and sorted by length before being cut into batches, so padding stays
small without changing what is trained on.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch

from bebop.data.tasks import Example, check_task_names, tool_mask
from bebop.data.tasks import get as get_task
from bebop.data.tokenizer import EOS, RESULT_CLOSE, RESULT_OPEN, CharTokenizer


def encode_demo(tokenizer: CharTokenizer, example: Example, solution: str, *,
                prompt_loss: bool = False) -> tuple[list[int], list[bool]]:
    """(tokens, loss_mask) for `prompt + solution + EOS`: loss on the tokens the policy writes, and on the
    prompt too with `prompt_loss` (prompts repeat names and numbers, which teaches copying from context)."""
    prompt = tokenizer.encode(example.prompt)
    answer = tokenizer.encode(solution + EOS)
    written = tool_mask(answer, tokenizer.token_id(RESULT_OPEN), tokenizer.token_id(RESULT_CLOSE))
    return prompt + answer, [prompt_loss] * len(prompt) + written


def pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists -> tokens [B, T] long, lengths [B] long."""
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("pad needs a non-empty list of non-empty sequences")
    lengths = torch.tensor([len(s) for s in seqs])
    tokens = torch.full((len(seqs), int(lengths.max())), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return tokens, lengths


def demo_batches(task_names: Sequence[str], tokenizer: CharTokenizer, *, batch_size: int, error_rate: float,
                 seed: int, bucket: int = 4, prompt_loss: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (tokens [B, T], loss_mask [B, T] bool) batches of demonstrations, tasks mixed evenly.

    Deterministic for a seed: prompts come from `task.sample(.., seed=seed + chunk)` and phrasing from one
    generator seeded with `seed`. Chunks of `bucket` batches are sorted by length to cut padding."""
    tasks = [get_task(n) for n in check_task_names(task_names)]
    generator = torch.Generator().manual_seed(seed)
    chunk = 0
    while True:
        n = batch_size * bucket
        picks = torch.randint(len(tasks), (n,), generator=generator).tolist()
        per_task = [iter(task.sample(picks.count(i), seed=seed * 1000 + chunk)) for i, task in enumerate(tasks)]
        seqs = []
        for t in picks:
            example = next(per_task[t])
            solution = tasks[t].demonstration(example, generator, error_rate=error_rate)
            seqs.append(encode_demo(tokenizer, example, solution, prompt_loss=prompt_loss))
        seqs.sort(key=lambda s: len(s[0]))
        order = torch.randperm(bucket, generator=generator).tolist()
        for b in order:
            part = seqs[b * batch_size : (b + 1) * batch_size]
            tokens, lengths = pad([s for s, _ in part], tokenizer.pad_id)
            mask, _ = pad([[int(m) for m in ms] for _, ms in part], 0)
            yield tokens, mask.bool()
        chunk += 1
