"""Demonstrations as token tensors for `bebop pretrain`.

`DemoBatches` streams demonstrations (`task.demonstration`, some deliberately wrong). A sequence is
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


class DemoBatches:
    """Endless (tokens [B, T], loss_mask [B, T] bool) batches of demonstrations, tasks mixed evenly.

    Deterministic for a seed: prompts come from `task.sample(.., seed=seed * 1000 + chunk)` and phrasing from one
    generator seeded with `seed`. Chunks of `bucket` batches are sorted by length to cut padding. `state_dict` /
    `load_state_dict` continue the stream where a checkpoint left it: the generator as the current chunk began, the
    chunk, and how many of its batches were served (the chunk is drawn again and those skipped)."""

    def __init__(self, task_names: Sequence[str], tokenizer: CharTokenizer, *, batch_size: int, error_rate: float,
                 seed: int, bucket: int = 4, prompt_loss: bool = False):
        self.tasks = [get_task(n) for n in check_task_names(task_names)]
        self.tokenizer, self.batch_size, self.error_rate = tokenizer, batch_size, error_rate
        self.seed, self.bucket, self.prompt_loss = seed, bucket, prompt_loss
        self.generator = torch.Generator().manual_seed(seed)
        self.chunk, self.served, self.began = -1, bucket, self.generator.get_state()
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.served == self.bucket:
            self.began, self.chunk, self.served = self.generator.get_state(), self.chunk + 1, 0
            self.batches = self._draw(self.chunk)
        self.served += 1
        return self.batches[self.served - 1]

    def _draw(self, chunk: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Chunk `chunk`'s batches, in the order they are served (its draws advance the generator)."""
        n, tasks = self.batch_size * self.bucket, self.tasks
        picks = torch.randint(len(tasks), (n,), generator=self.generator).tolist()
        per_task = [iter(task.sample(picks.count(i), seed=self.seed * 1000 + chunk)) for i, task in enumerate(tasks)]
        seqs = []
        for t in picks:
            example = next(per_task[t])
            solution = tasks[t].demonstration(example, self.generator, error_rate=self.error_rate)
            seqs.append(encode_demo(self.tokenizer, example, solution, prompt_loss=self.prompt_loss))
        seqs.sort(key=lambda s: len(s[0]))
        batches = []
        for b in torch.randperm(self.bucket, generator=self.generator).tolist():
            part = seqs[b * self.batch_size : (b + 1) * self.batch_size]
            tokens, _ = pad([s for s, _ in part], self.tokenizer.pad_id)
            mask, _ = pad([[int(m) for m in ms] for _, ms in part], 0)
            batches.append((tokens, mask.bool()))
        return batches

    def state_dict(self) -> dict:
        return {"generator": self.began, "chunk": self.chunk, "served": self.served}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.chunk, self.served = int(state["chunk"]), int(state["served"])
        if self.chunk >= 0:
            self.batches = self._draw(self.chunk)
