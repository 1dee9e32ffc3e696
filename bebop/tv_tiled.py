"""Full-vocabulary TV overlap without materialising the softmax.

Rejection sampling accepts draft step i with probability α_i = Σ_v min(p_v, q_v) = 1 - d_TV(p, q)
(PAPER §2), so the TV losses of PAPER §4 need the overlap of two full-vocabulary distributions at
every (anchor, step). Written naively, autograd keeps p, q, p - q and |p - q| alive, each as large
as the logits ([N, V] fp32: 1.2 GB at N = 2048, V = 151936). Top-K truncation is not an option
(the paper saw it slow convergence or spike the loss), so this module streams the vocabulary.

Per row, with p = softmax(target / T) (held fixed) and q = softmax(draft / T):

    pass 1  online logsumexp of both logits, tile by tile          -> lse_p, lse_q   [N]
    pass 2  overlap = Σ_v min(p_v, q_v),  S = Σ_v q_v·1[q_v ≤ p_v]  -> overlap, S    [N]
    backward  ∂overlap/∂z_j = (q_j / T)·(1[q_j ≤ p_j] - S)   (q and p recomputed per tile)

The backward is the softmax Jacobian applied to ∂min(p, q)/∂q = 1[q ≤ p]. For d_TV = 1 - overlap it
is PAPER §4's -q_j(1[q_j ≤ p_j] - S) = q_j(S - 1 + 1[q_j > p_j]). At a tie q_v = p_v the minimum has
no derivative; we take the 1[q ≤ p] branch. When q = p on the whole row this gives q·(1 - Σq) ≈ 0,
the same as autograd through 0.5·Σ|p - q|.

Only the inputs (references, no copies) and four [N] statistics are saved for backward; working
memory is a few [rows, tile] float32 blocks. Each tile is scaled by `bebop.sampling.scaled_logits`, the
engine's own temperature scaling, so p and q are the distributions rollouts sample from. Arithmetic is
float32 whatever the input dtype (bf16 logits are upcast one block at a time); the gradient is returned in
the input's dtype.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from bebop.sampling import scaled_logits

# Rows per block are chosen so one float32 [rows, tile] block stays near 16 MB: small enough that a
# few live blocks are negligible next to the logits, large enough that per-block overhead is noise.
BLOCK_ELEMENTS = 1 << 22


def _block_rows(tile: int, row_block: int | None) -> int:
    return row_block if row_block is not None else max(1, BLOCK_ELEMENTS // tile)


def _probs_block(logits: torch.Tensor, cols: slice, lse: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T)[:, cols] recomputed from the row's logsumexp."""
    # Out of place: at T = 1 a float32 block is a view of the logits, which must not change.
    return (scaled_logits(logits[:, cols], temperature) - lse[:, None]).exp_()  # [R, t]


def _logsumexp(logits: torch.Tensor, temperature: float, tile: int) -> torch.Tensor:
    """Online logsumexp over the last dim of logits / T, one vocabulary tile at a time."""
    rows, vocab = logits.shape
    running_max = torch.full((rows,), -math.inf, dtype=torch.float32, device=logits.device)
    running_sum = torch.zeros(rows, dtype=torch.float32, device=logits.device)
    for start in range(0, vocab, tile):
        block = scaled_logits(logits[:, start:start + tile], temperature)  # [R, t] may view the logits
        new_max = torch.maximum(running_max, block.amax(dim=-1))
        # A row that is -inf so far must not produce exp(-inf - (-inf)) = nan.
        shift = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
        running_sum = running_sum * torch.exp(running_max - shift) + (block - shift[:, None]).exp_().sum(-1)
        running_max = new_max
    return running_max + torch.log(running_sum)  # [R]


def _overlap_and_below(
    draft: torch.Tensor,
    target: torch.Tensor,
    draft_lse: torch.Tensor,
    target_lse: torch.Tensor,
    temperature: float,
    tile: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass 2: Σ min(p, q) and S = Σ q·1[q ≤ p] per row."""
    rows, vocab = draft.shape
    overlap = torch.zeros(rows, dtype=torch.float32, device=draft.device)
    below = torch.zeros_like(overlap)
    for start in range(0, vocab, tile):
        cols = slice(start, start + tile)
        q = _probs_block(draft, cols, draft_lse, temperature)  # [R, t]
        p = _probs_block(target, cols, target_lse, temperature)  # [R, t]
        overlap += torch.minimum(p, q).sum(-1)
        below += q.masked_fill_(q > p, 0.0).sum(-1)
    return overlap, below


class TVOverlap(torch.autograd.Function):
    """overlap[n] = Σ_v min(softmax(target[n]/T)_v, softmax(draft[n]/T)_v); gradient to draft only."""

    @staticmethod
    def forward(ctx, draft_logits, target_logits, temperature: float, tile: int, row_block: int):
        overlap = torch.empty(draft_logits.shape[0], dtype=torch.float32, device=draft_logits.device)
        draft_lse, target_lse, below = torch.empty_like(overlap), torch.empty_like(overlap), torch.empty_like(overlap)
        for r0 in range(0, draft_logits.shape[0], row_block):
            rows = slice(r0, r0 + row_block)
            draft, target = draft_logits[rows], target_logits[rows]  # [R, V]
            draft_lse[rows] = _logsumexp(draft, temperature, tile)
            target_lse[rows] = _logsumexp(target, temperature, tile)
            overlap[rows], below[rows] = _overlap_and_below(
                draft, target, draft_lse[rows], target_lse[rows], temperature, tile
            )
        ctx.save_for_backward(draft_logits, target_logits, draft_lse, target_lse, below)
        ctx.temperature, ctx.tile, ctx.row_block = temperature, tile, row_block
        return overlap  # [N]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_overlap):
        draft_logits, target_logits, draft_lse, target_lse, below = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        temperature, tile, row_block = ctx.temperature, ctx.tile, ctx.row_block
        grad = torch.empty_like(draft_logits, memory_format=torch.contiguous_format)  # [N, V]
        scale = grad_overlap.to(torch.float32) * (1.0 / temperature)  # [N] ∂(z/T)/∂z
        vocab = draft_logits.shape[1]
        for r0 in range(0, draft_logits.shape[0], row_block):
            rows = slice(r0, r0 + row_block)
            for start in range(0, vocab, tile):
                cols = slice(start, start + tile)
                q = _probs_block(draft_logits[rows], cols, draft_lse[rows], temperature)  # [R, t]
                p = _probs_block(target_logits[rows], cols, target_lse[rows], temperature)  # [R, t]
                weight = (q <= p).to(torch.float32).sub_(below[rows, None])  # 1[q ≤ p] - S
                grad[rows, cols] = weight.mul_(q).mul_(scale[rows, None])
        return grad, None, None, None, None


def tv_overlap_tiled(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    temperature: float = 1.0,
    tile: int = 8192,
    *,
    row_block: int | None = None,
) -> torch.Tensor:
    """α = Σ_v min(p_v, q_v) over the last dim, streamed over the vocabulary.

    draft_logits, target_logits: [..., V] (any float dtype); returns float32 [...]. The target is
    detached: only draft_logits receives a gradient. `tile` is the number of vocabulary columns per
    block; `row_block` the rows per block (default: about BLOCK_ELEMENTS / tile).
    """
    if draft_logits.shape != target_logits.shape:
        raise ValueError(
            f"draft_logits shape {tuple(draft_logits.shape)} != target_logits shape {tuple(target_logits.shape)}"
        )
    if draft_logits.dim() == 0 or draft_logits.shape[-1] == 0:
        raise ValueError(f"logits need a non-empty vocabulary dim, got shape {tuple(draft_logits.shape)}")
    for name, x in (("draft_logits", draft_logits), ("target_logits", target_logits)):
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor, got {x.dtype}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if not (isinstance(tile, int) and tile >= 1):
        raise ValueError(f"tile must be a positive int, got {tile!r}")
    if row_block is not None and not (isinstance(row_block, int) and row_block >= 1):
        raise ValueError(f"row_block must be a positive int or None, got {row_block!r}")
    lead, vocab = draft_logits.shape[:-1], draft_logits.shape[-1]
    overlap = TVOverlap.apply(
        draft_logits.reshape(-1, vocab),
        target_logits.detach().reshape(-1, vocab),
        float(temperature),
        tile,
        _block_rows(tile, row_block),
    )
    return overlap.reshape(lead)  # [...]
