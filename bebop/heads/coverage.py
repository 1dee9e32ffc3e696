"""How much of the policy's probability a draft vocabulary of K ids holds: the soft coverage p(S_K), the cap on any
draft over S_K (bebop.draft_vocab), measured held out.

The corpus (the policy's own answers, `bebop.heads.corpus`) is split by sequence into two halves. On one half the
policy's next-token distributions at every position it wrote are summed (`probability_mass`), and S_K is the K ids
with the most of that mass (plus the stop ids); on the other half each position's p(S_K) is measured. The mean of
p(S_K) over those positions is the most acceptance under a draft over S_K can reach there, at that temperature.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from bebop.data.batches import pad
from bebop.draft_vocab import choose, coverage, probability_mass, target_logp
from bebop.models.transformer import Transformer

ROWS_PER_FORWARD = 8  # sequences per backbone forward: a few hundred positions' hidden states at a time


@dataclass(frozen=True)
class Coverage:
    size: int  # K
    mean: float  # mean p(S_K) over the held-out half's positions
    sem: float  # its standard error over those positions (they are correlated within a sequence: a lower bound)
    positions: int  # how many held-out positions


def soft_coverage(model: Transformer, corpus: dict, weight: torch.Tensor, sizes: list[int], *, temperature: float,
                  required: tuple[int, ...] = ()) -> list[Coverage]:
    """S_K chosen on the even sequences of `corpus`, p(S_K) measured on the odd ones, for each K in `sizes`;
    `weight` is the LM head [V, d] in the dtype the logits are made in."""
    if len(corpus["tokens"]) < 2:
        raise ValueError(f"need at least 2 sequences to choose S on one half and measure it on the other, got "
                         f"{len(corpus['tokens'])}")
    halves = [{k: corpus[k][i::2] for k in ("tokens", "trainable")} for i in (0, 1)]
    mass = torch.zeros(weight.shape[0], dtype=torch.float64, device=weight.device)  # [V]
    for rows in written_hidden(model, halves[0]):
        mass += probability_mass(rows, weight, temperature)[0]
    chosen = [choose(mass, size, required) for size in sizes]
    shares: list[list[torch.Tensor]] = [[] for _ in sizes]
    for rows in written_hidden(model, halves[1]):
        _, lse = probability_mass(rows, weight, temperature)  # [n]
        for share, ids in zip(shares, chosen):
            share.append(coverage(target_logp(rows, weight[ids], lse, temperature)))  # [n]
    out = []
    for size, share in zip(sizes, shares):
        values = torch.cat(share)  # [N]
        sem = float(values.std() / values.numel() ** 0.5) if values.numel() > 1 else float("nan")
        out.append(Coverage(size, float(values.mean()), sem, int(values.numel())))
    return out


@torch.no_grad()
def written_hidden(model: Transformer, corpus: dict) -> Iterator[torch.Tensor]:
    """The backbone's hidden states [n, d] at the positions whose next token the policy wrote, a few sequences of
    `corpus` at a time."""
    device = model.lm_head.weight.device
    for start in range(0, len(corpus["tokens"]), ROWS_PER_FORWARD):
        tokens, _ = pad(corpus["tokens"][start:start + ROWS_PER_FORWARD], 0)
        written, _ = pad([[int(w) for w in ws] for ws in corpus["trainable"][start:start + ROWS_PER_FORWARD]], 0)
        _, hidden = model(tokens.to(device), compute_logits=False)  # [B, T, d]
        next_written = torch.nn.functional.pad(written[:, 1:].bool(), (0, 1), value=False)  # [B, T]
        yield hidden[next_written.to(device)]  # [n, d]
