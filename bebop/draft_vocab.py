"""A draft vocabulary S: the draft head predicts over K of the target's V tokens (EAGLE-3's d2t, FR-Spec, VocabTrim).

Drafting through the whole LM head costs a [V, d] matmul per draft position; over S it costs [K, d]. The draft q is
then a distribution over S, zero off it, and every rule stays exactly lossless (PAPER §2; docs/paper.md, "A draft
vocabulary"): rejection sampling tests the q the draft was sampled from, and its residual max(0, p - q) is taken over
the full vocabulary, where it equals p off S. The price is acceptance: α = Σ_{x∈S} min(p(x), q(x)) ≤ p(S), so the
*soft coverage*, the mean of p(S) over the policy's own positions, caps what any head over S can accept.

Layout, in the draft's index space 0..K-1:
    ids  [K] long   the target ids of S, strictly increasing: draft index i drafts target id ids[i]
    d2t  [K] long   EAGLE-3's offsets, ids[i] - i (what SpecForge / vLLM store beside such a head)
    t2d  [V] bool   EAGLE-3's membership mask, t2d[ids] = True
A head stores `d2t` and `t2d` (bebop.models.checkpoint); everything else reads `ids`.

S is chosen by probability mass, not by counts (`choose`): the K tokens carrying the most of the policy's own
probability over its positions (`probability_mass`), plus the ids that must stay draftable (stop and end-of-turn
tokens: without them a draft can never end a turn).
"""

from __future__ import annotations

import torch

# The row chunks of every pass of rows through an LM head (this module's, and bebop.losses_from_hidden's).
# Logit elements per chunk: a float32 [rows, V or K] block of 4 MiB. glibc maps every block of 32 MiB or more from the
# kernel and unmaps it on free, so chunks of that size (8M elements, until 2026-12-07) faulted their pages in afresh
# for every chunk of every step; blocks well under it are reused from the heap, which made train-mtp's steps over
# SmolLM2's draft vocabulary faster and their heap smaller, and this module's pass through the whole LM head a little
# faster (docs/real-model.md).
CHUNK_ELEMENTS = 1 << 20
# Rows per chunk at least: each chunk reads the whole weight once, so over a whole vocabulary (SmolLM2's 49,152 ids:
# 21 rows by the elements alone) a chunk keeps enough rows for that read to pay (128 rows there: a 24 MiB block,
# still under the size glibc always maps; 64 were slower than the old 170-row chunks in a step's backward).
MIN_CHUNK_ROWS = 128


def default_chunk_rows(width: int) -> int:
    """Rows per chunk when a caller names none, for logits `width` wide (V or K)."""
    return max(MIN_CHUNK_ROWS, CHUNK_ELEMENTS // width)


def check_ids(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`ids` if it is a valid draft vocabulary of a V = `vocab_size` target: 1-D long, non-empty, strictly
    increasing, inside [0, V); else one ValueError naming what is wrong."""
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"a draft vocabulary must be a non-empty 1-D long tensor, got "
                         f"{getattr(ids, 'dtype', type(ids).__name__)} of shape {tuple(getattr(ids, 'shape', ()))}")
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError("a draft vocabulary's ids must be strictly increasing (sorted, no repeats)")
    if int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
        raise ValueError(f"a draft vocabulary's ids must lie in [0, {vocab_size}), got [{int(ids[0])}, {int(ids[-1])}]")
    return ids


def to_d2t(ids: torch.Tensor) -> torch.Tensor:
    """EAGLE-3's offsets [K]: target id = draft index + d2t[draft index]."""
    return ids - torch.arange(ids.numel(), device=ids.device)


def from_d2t(d2t: torch.Tensor) -> torch.Tensor:
    """The ids [K] that offsets `d2t` [K] encode (the inverse of `to_d2t`)."""
    return d2t.long() + torch.arange(d2t.numel(), device=d2t.device)


def to_t2d(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """EAGLE-3's membership mask [V] bool: True at the ids of S."""
    return torch.zeros(vocab_size, dtype=torch.bool, device=ids.device).index_fill_(0, ids, True)


def choose(mass: torch.Tensor, size: int, required: tuple[int, ...] = ()) -> torch.Tensor:
    """The draft vocabulary of `size` ids [K] (sorted): every id of `required`, then the ids with the most `mass`
    [V] (summed probability, `probability_mass`); ties go to the lower id."""
    vocab = mass.shape[-1]
    if mass.dim() != 1:
        raise ValueError(f"mass must be [V], got shape {tuple(mass.shape)}")
    if not isinstance(size, int) or not 1 <= size <= vocab:
        raise ValueError(f"a draft vocabulary's size must be an int in [1, {vocab}], got {size!r}")
    must = sorted(set(int(i) for i in required))
    if must and (must[0] < 0 or must[-1] >= vocab):
        raise ValueError(f"required ids must lie in [0, {vocab}), got {must}")
    if len(must) > size:
        raise ValueError(f"{len(must)} required ids do not fit a draft vocabulary of {size}")
    score = mass.double().clone()
    score[must] = float("inf")  # required ids rank first
    # A stable descending sort keeps ties in id order, so the choice does not hang on the sort's implementation.
    order = torch.sort(score, descending=True, stable=True).indices  # [V]
    return order[:size].sort().values


def probability_mass(hidden: torch.Tensor, lm_head_weight: torch.Tensor, temperature: float = 1.0, *,
                     counted: torch.Tensor | None = None, chunk_rows: int | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass of rows through the full LM head: (mass [V] float64, Σ of p = softmax(h·Wᵀ / T) over the rows
    `counted` [N] bool marks (default all); lse [N] float32, every row's log-normaliser logsumexp(h·Wᵀ / T)).

    hidden [N, d] (the backbone's hidden states), lm_head_weight [V, d] (its LM head, in the dtype the logits are
    made in). `lse` is what training over S needs of the full vocabulary: with it the target's probabilities on S
    are exactly exp(h·W_Sᵀ / T - lse) without the rest of the LM head (`target_logp`)."""
    if hidden.dim() != 2 or lm_head_weight.dim() != 2 or hidden.shape[1] != lm_head_weight.shape[1]:
        raise ValueError(f"need hidden [N, d] and lm_head_weight [V, d]; got {tuple(hidden.shape)} and "
                         f"{tuple(lm_head_weight.shape)}")
    if counted is not None and counted.shape != hidden.shape[:1]:
        raise ValueError(f"counted must be [N] = [{hidden.shape[0]}], got {tuple(counted.shape)}")
    rows = chunk_rows or default_chunk_rows(lm_head_weight.shape[0])
    mass = torch.zeros(lm_head_weight.shape[0], dtype=torch.float64, device=hidden.device)  # [V]
    lse = []
    for i, block in enumerate(hidden.split(rows)):
        logits = torch.nn.functional.linear(block.to(lm_head_weight.dtype), lm_head_weight).float() / temperature
        block_lse = logits.logsumexp(-1)  # [R]
        probs = (logits - block_lse[:, None]).exp_()  # [R, V]
        if counted is not None:
            probs = probs[counted[i * rows:(i + 1) * rows]]
        mass += probs.sum(0, dtype=torch.float64)
        lse.append(block_lse)
    return mass, torch.cat(lse) if lse else hidden.new_zeros(0, dtype=torch.float32)


def log_normaliser(hidden: torch.Tensor, lm_head_weight: torch.Tensor, temperature: float = 1.0, *,
                   chunk_rows: int | None = None) -> torch.Tensor:
    """logsumexp(h·Wᵀ / T) per row [N] float32: `probability_mass`'s second half."""
    return probability_mass(hidden, lm_head_weight, temperature, chunk_rows=chunk_rows)[1]


def target_logp(target_hidden: torch.Tensor, draft_weight: torch.Tensor, lse: torch.Tensor,
                temperature: float = 1.0) -> torch.Tensor:
    """The target's exact log-probabilities on S: target_hidden [N, d], draft_weight [K, d] (W_S, the LM head's rows
    of S), lse [N] (`probability_mass`'s, at the same temperature and weight dtype) -> float32 [N, K]. Not normalised
    over S: logsumexp of a row is log p(S) ≤ 0 (clamped there, against rounding)."""
    logits = torch.nn.functional.linear(target_hidden.to(draft_weight.dtype), draft_weight).float() / temperature
    return (logits - lse.float()[:, None]).clamp_(max=0.0)


def coverage(target_logp_on_s: torch.Tensor) -> torch.Tensor:
    """p(S) per row, the cap on any draft's acceptance there: [N, K] (`target_logp`) -> [N]."""
    return target_logp_on_s.logsumexp(-1).exp().clamp(max=1.0)


def scatter_probs(draft_probs: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """q over S [..., K] -> q over the target's vocabulary [..., V], exactly 0 off S (what `bebop.verify` tests)."""
    if draft_probs.shape[-1] != ids.numel():
        raise ValueError(f"draft_probs' last dim {draft_probs.shape[-1]} != the draft vocabulary's {ids.numel()}")
    full = draft_probs.new_zeros(*draft_probs.shape[:-1], vocab_size)  # [..., V]
    return full.index_copy_(-1, ids, draft_probs)
