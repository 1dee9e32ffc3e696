"""The GRPO update's batch layout: each prompt computed once for its whole group, in micro-batches.

GRPO samples every prompt `group_size` times, and a rollout row is prompt + completion; on the shipped math
task the prompt is about half of a row. Training on the right-padded rows [N, L] computes each prompt
group_size times and every row's padding (about a third of [N, L], since rollout lengths spread over 2x).
Here the update runs `Transformer.forward_shared_prefix`: the prompts of a micro-batch once ([G, P]) and the
completions ([n, S]) attending over their prompt's keys and values, which gives the same logits, and the
same gradient, as the rows; the gradients of a group's completions meet in its one prompt.

    row i = prompt[g(i)] (length P_i) + completion_i (length C_i)
    completion token j of row i is predicted at row position P_i - 1 + j:
        j = 0   by the prompt's last position      prefix_logits[g(i), P_i - 1]
        j >= 1  by the completion's position j - 1  suffix_logits[i, j - 1]

Micro-batches hold whole groups, longest first, under a budget of computed tokens (padding included):
groups × longest prompt + rows × longest completion, as verl's dynamic batching budgets tokens per step.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import torch


def prompt_groups(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """Row indices grouped by identical prompt, groups in order of first appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(tuple(prompt), []).append(i)
    return list(groups.values())


def micro_batches(groups: list[list[int]], prompt_lengths: Sequence[int], lengths: Sequence[int],
                  max_tokens: int) -> list[list[list[int]]]:
    """Pack `groups` (row indices sharing a prompt) into micro-batches of at most `max_tokens` computed tokens
    each (see the module docstring; a group over the budget gets a micro-batch of its own; 0 = one for all)."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ValueError(f"max_tokens must be a non-negative int, got {max_tokens!r}")
    longest = lambda group: max(lengths[i] for i in group)  # noqa: E731
    order = sorted(groups, key=lambda group: (-longest(group), group[0]))
    if max_tokens == 0:
        return [order] if order else []

    def cost(part: list[list[int]]) -> int:
        rows = [i for group in part for i in group]
        completion = max(lengths[i] - prompt_lengths[i] for i in rows)
        return len(part) * max(prompt_lengths[group[0]] for group in part) + len(rows) * max(completion, 1)

    batches: list[list[list[int]]] = []
    for group in order:
        if batches and cost(batches[-1] + [group]) <= max_tokens:
            batches[-1].append(group)
        else:
            batches.append([group])
    return batches


@dataclass(frozen=True)
class SharedOutputs:
    """The policy's outputs on a `SharedPromptLayout` (`Transformer.forward_shared_prefix`)."""

    prefix_logits: torch.Tensor  # [G, P, V] over each group's prompt
    prefix_hidden: torch.Tensor  # [G, P, d]
    suffix_logits: torch.Tensor  # [n, S, V] over each row's completion
    suffix_hidden: torch.Tensor  # [n, S, d]


class SharedPromptLayout:
    """The tensors of one micro-batch (`groups` of rows of a RolloutBatch) in the shared-prompt layout."""

    def __init__(self, batch, groups: list[list[int]]):
        rows, firsts = [i for group in groups for i in group], [group[0] for group in groups]
        device = batch.tokens.device
        self.index = torch.tensor(rows, device=device)  # [n] rows of the batch, in micro-batch order
        self.group = torch.tensor([g for g, group in enumerate(groups) for _ in group], device=device)  # [n]
        self.prefix_lengths = batch.prompt_lengths[firsts]  # [G]
        self.starts = self.prefix_lengths[self.group]  # [n] P_i
        completion = batch.lengths[self.index] - self.starts  # [n] C_i
        L = batch.tokens.shape[1]
        P, S = int(self.prefix_lengths.max()), max(1, int(completion.max()))  # HOST SYNC: the layout's shape
        j = torch.arange(S, device=device)  # [S]
        tokens = batch.tokens[self.index]  # [n, L]
        # Past a row's own end these read other positions: never attended to by its real tokens, never trained.
        self.prefix = batch.tokens[firsts, :P]  # [G, P]
        self.suffix = tokens.gather(1, (self.starts[:, None] + j).clamp(max=L - 1))  # [n, S] completion tokens
        target_at = (self.starts[:, None] - 1 + j).clamp(max=L - 2)  # [n, S] index into the batch's [N, L-1]
        real = j < completion[:, None]  # [n, S]
        self.mask = batch.policy_mask[self.index].gather(1, target_at) & real  # [n, S]
        self.behaviour_logprobs = batch.behaviour_logprobs[self.index].gather(1, target_at)  # [n, S]
        self.width = L

    def emptied(self) -> "SharedPromptLayout":
        """The same micro-batch with no token to train on: a rank with fewer micro-batches than the busiest runs
        such ones, so that every rank issues the same collectives (bebop.rl.parallel), and gets no gradient."""
        empty = copy.copy(self)
        empty.mask = torch.zeros_like(self.mask)
        return empty

    def forward(self, model, taps: tuple[int, ...] = ()) -> SharedOutputs:
        """model.forward_shared_prefix on this layout (with `taps`, the hidden states are a fused head's features)."""
        return SharedOutputs(*model.forward_shared_prefix(self.prefix, self.prefix_lengths, self.suffix, self.group,
                                                          taps))

    def row_logits(self, out: SharedOutputs) -> torch.Tensor:
        """Logits that predict each completion token: [n, S, V], aligned with `suffix` (see the module docstring)."""
        first = out.prefix_logits[self.group, self.starts - 1]  # [n, V] the prompt's last position
        return torch.cat([first[:, None], out.suffix_logits[:, :-1]], 1)  # [n, S, V]

    def row_hidden(self, out: SharedOutputs) -> torch.Tensor:
        """The hidden states in the batch's row layout [n, L, d], detached, float32 (what an online head trains on)."""
        return self.rows(out.prefix_hidden.detach().float(), out.suffix_hidden.detach().float())

    def rows(self, prefix_x: torch.Tensor, suffix_x: torch.Tensor) -> torch.Tensor:
        """Per-position outputs [G, P, X] and [n, S, X] back in the batch's row layout [n, L, X] (positions past a
        row's end hold no meaning)."""
        P, S = prefix_x.shape[1], suffix_x.shape[1]
        t = torch.arange(self.width, device=suffix_x.device)  # [L]
        from_prefix = prefix_x[self.group][:, t.clamp(max=P - 1)]  # [n, L, X]
        at = (t[None] - self.starts[:, None]).clamp(0, S - 1)  # [n, L]
        from_suffix = suffix_x.gather(1, at[..., None].expand(-1, -1, suffix_x.shape[-1]))  # [n, L, X]
        return torch.where((t[None] < self.starts[:, None])[..., None], from_prefix, from_suffix)
