"""The five draft losses of PAPER §4, and the acceptance quantities they are built from.

The draft (MTP head) q is trained to imitate the target (backbone) p at the aligned position: for
draft step k at anchor t, p is the backbone's next-token distribution at position t + k. p is
always detached: only the draft learns. Both sides are taken at the rollout temperature T, through
`bebop.sampling` (the same scaling the engine samples from).

    objective  per (anchor, step)           gradient w.r.t. draft logit z_j (T = 1)
    "ce"       -log q(y)                    q_j - 1[j = y]
    "kl"       Σ p log(p/q)                 q_j - p_j
    "rkl"      Σ q log(q/p)                 q_j (log(q_j/p_j) - KL(q‖p))
    "tv"       d_TV(p, q) = 1 - α           -q_j (1[q_j ≤ p_j] - S),  S = Σ_v q_v 1[q_v ≤ p_v]
    "e2e_tv"   per anchor: 1 - (1/γ) Σ_j Π_{i≤j} α_i   (chain rule through the products)

α_i = Σ_v min(p_i, q_i) is the rejection-sampling acceptance probability of step i (PAPER §2), so
"e2e_tv" is 1 - E[accepted drafts]/γ: it spends effort on early steps, which sit in more products.
Why TV rather than KL: its gradient is bounded by q_j, so effort goes where the draft puts mass,
and acceptance stops falling as the policy's entropy rises (PAPER §3).

"tv" and "e2e_tv" use the vocabulary-tiled overlap of `bebop.tv_tiled` (never a full softmax);
`tv_distance` is the plain reference. Everything is computed in float32 whatever the input dtype.

`draft_loss` takes logits. At a real vocabulary (V = 151,936) [B, T, γ, V] float32 logits are gigabytes, so
`draft_loss_from_hidden` takes the hidden states and the LM head instead: only valid anchors go through the
LM head, a chunk of rows at a time, and backward recomputes each chunk's logits (same value and gradient).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from bebop.sampling import logprobs_from_logits
from bebop.tv_tiled import tv_overlap_tiled

OBJECTIVES = ("ce", "kl", "rkl", "tv", "e2e_tv")

# Target log-probabilities are clamped below at this value (nats) inside "kl" and "rkl". A target
# logit of -inf (e.g. a token removed by top-k) gives p = 0 exactly; reverse KL is then infinite
# wherever q > 0. e^-100 ≈ 4e-44 is already below the smallest normal float32, so the clamp only
# touches probabilities float32 cannot tell from zero, and caps their cost at 100 nats per unit of
# q mass: large, finite, and with the gradient formula of the table unchanged.
LOG_PROB_FLOOR = -100.0

# Logit elements per chunk in the hidden-state path (`draft_loss_from_hidden`): one float32 [rows, V] chunk
# stays near 32 MB, so the few such blocks a loss keeps alive per chunk are small next to any model.
CHUNK_ELEMENTS = 1 << 23


def tv_distance(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """d_TV(p, q) = 0.5·Σ|p - q| over the last dim: [..., V] x2 -> float32 [...]."""
    if target_probs.shape != draft_probs.shape:
        raise ValueError(
            f"target_probs shape {tuple(target_probs.shape)} != draft_probs shape {tuple(draft_probs.shape)}"
        )
    if target_probs.dim() == 0:
        raise ValueError("target_probs and draft_probs need a vocabulary dim, got scalars")
    return 0.5 * (target_probs.float() - draft_probs.float()).abs().sum(-1)


def expected_accepted(alpha: torch.Tensor) -> torch.Tensor:
    """E[accepted drafts] = Σ_j Π_{i≤j} α_i: alpha [..., γ] -> [...].

    Step j is accepted only if steps 1..j all were, each with its conditional probability α_i.
    """
    if alpha.dim() == 0:
        raise ValueError("alpha needs a last dim of γ per-step acceptance probabilities, got a scalar")
    if not alpha.is_floating_point():
        raise ValueError(f"alpha must be a floating tensor, got {alpha.dtype}")
    return torch.cumprod(alpha, dim=-1).sum(-1)


def acceptance_alpha(
    draft_logits: torch.Tensor, target_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Per-step RS acceptance α = 1 - d_TV(p, q): logits [B, T, γ, V] -> float32 [B, T, γ].

    Target detached; differentiable w.r.t. the draft (the trainer logs 1 - α as mtp/d_tv_mean).
    """
    _check_logits(draft_logits, target_logits)
    _check_temperature(temperature)
    return tv_overlap_tiled(draft_logits, target_logits, temperature)


def draft_loss(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    *,
    objective: str,
    labels: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Scalar draft loss, averaged over the valid anchors (and over steps within an anchor).

    draft_logits  [B, T, γ, V]  draft step k at anchor t
    target_logits [B, T, γ, V]  backbone logits for the same token (detached here)
    labels        [B, T, γ]     data tokens, "ce" only; checked at valid anchors only, so padding
                                values at masked anchors are fine
    mask          [B, T] bool   anchors whose whole γ-chain is valid (None: all). Masked anchors
                                must hold finite logits; they add nothing and get exactly zero gradient.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; valid objectives: {', '.join(OBJECTIVES)}")
    _check_logits(draft_logits, target_logits)
    _check_temperature(temperature)
    batch, anchors = draft_logits.shape[:2]
    mask = _check_mask(mask, batch, anchors, draft_logits.device)
    labels = _check_labels(labels, draft_logits.shape, mask) if objective == "ce" else None
    step_values = _step_values(objective, draft_logits, target_logits.detach(), labels, temperature)  # [B, T, γ]
    per_anchor = _anchor_losses(objective, step_values)  # [B, T]
    # where(), not a product: a masked anchor's value never reaches the sum, nor its gradient.
    per_anchor = torch.where(mask, per_anchor, torch.zeros_like(per_anchor))  # [B, T]
    return per_anchor.sum() / mask.sum()


def draft_loss_from_hidden(
    draft_hidden: torch.Tensor,
    target_hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    *,
    objective: str,
    labels: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """`draft_loss` of draft_logits = draft_hidden·Wᵀ and target_logits = target_hidden·Wᵀ, never holding
    either whole: the path for real vocabularies, where [B, T, γ, V] logits do not fit.

    draft_hidden   [B, T, γ, d]  the head's outputs h_k (`MTPHead.chain_hidden`)
    target_hidden  [B, T, γ, d]  the backbone's hidden states at the aligned positions (`chain_targets` applied
                                 to the hidden states); detached here
    lm_head_weight [V, d]        the backbone's LM head W, frozen (detached here); logits are made in its dtype
    labels, mask, temperature    as in `draft_loss`

    Only valid anchors reach the LM head. Their M·γ (anchor, step) rows go through it `chunk_rows` at a time
    (default about CHUNK_ELEMENTS / V), and each chunk is checkpointed: backward recomputes the chunk's logits
    instead of keeping them, so the graph holds [M·γ, d] rows and per-row values, never [M·γ, V] logits.
    """
    return _loss_from_hidden(draft_hidden, target_hidden, lm_head_weight, objective, labels, mask, temperature,
                             chunk_rows, with_alpha=False)[0]


def draft_loss_and_alpha_from_hidden(
    draft_hidden: torch.Tensor,
    target_hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    *,
    objective: str,
    labels: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(`draft_loss_from_hidden`, `acceptance_alpha_from_hidden` detached [M, γ]) from the same chunks' logits: what
    a training step optimises and logs, for one trip of the rows through the LM head instead of two (at a real
    vocabulary the LM head is most of a head's training step)."""
    return _loss_from_hidden(draft_hidden, target_hidden, lm_head_weight, objective, labels, mask, temperature,
                             chunk_rows, with_alpha=True)


def _loss_from_hidden(draft_hidden: torch.Tensor, target_hidden: torch.Tensor, lm_head_weight: torch.Tensor,
                      objective: str, labels: torch.Tensor | None, mask: torch.Tensor | None, temperature: float,
                      chunk_rows: int | None, *, with_alpha: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The loss [] and, `with_alpha`, α [M, γ] (detached) of the two public functions above."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; valid objectives: {', '.join(OBJECTIVES)}")
    draft_rows, target_rows, mask = _hidden_rows(draft_hidden, target_hidden, lm_head_weight, mask)  # [M·γ, d]
    label_rows = None
    if objective == "ce":
        logits_shape = torch.Size((*draft_hidden.shape[:3], lm_head_weight.shape[0]))
        label_rows = _check_labels(labels, logits_shape, mask)[mask].reshape(-1)  # [M·γ]
    values, alpha = _chunked_step_values(objective, draft_rows, target_rows, lm_head_weight, label_rows, temperature,
                                         chunk_rows, with_alpha=with_alpha)  # [M·γ] each
    depth = draft_hidden.shape[2]
    loss = _anchor_losses(objective, values.reshape(-1, depth)).mean()  # mean over [M]
    return loss, None if alpha is None else alpha.reshape(-1, depth)


def acceptance_alpha_from_hidden(
    draft_hidden: torch.Tensor,
    target_hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """`acceptance_alpha` from hidden states, chunked like `draft_loss_from_hidden`, at valid anchors only:
    draft_hidden, target_hidden [B, T, γ, d], lm_head_weight [V, d], mask [B, T] -> float32 [M, γ] (anchors in
    row-major order of the mask)."""
    draft_rows, target_rows, _ = _hidden_rows(draft_hidden, target_hidden, lm_head_weight, mask)  # [M·γ, d]
    alpha, _ = _chunked_step_values("tv", draft_rows, target_rows, lm_head_weight, None, temperature, chunk_rows)
    return alpha.reshape(-1, draft_hidden.shape[2])  # [M, γ]


def _hidden_rows(draft_hidden: torch.Tensor, target_hidden: torch.Tensor, lm_head_weight: torch.Tensor,
                 mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Checks the hidden-state path's inputs; returns the valid anchors' rows [M·γ, d] (draft, detached target)
    and the mask [B, T]."""
    if draft_hidden.dim() != 4:
        raise ValueError(f"draft_hidden must be [B, T, γ, d], got shape {tuple(draft_hidden.shape)}")
    if draft_hidden.shape != target_hidden.shape:
        raise ValueError(
            f"draft_hidden shape {tuple(draft_hidden.shape)} != target_hidden shape {tuple(target_hidden.shape)}"
        )
    if 0 in draft_hidden.shape:
        raise ValueError(f"draft_hidden has an empty dim: shape {tuple(draft_hidden.shape)}")
    dim = draft_hidden.shape[-1]
    if lm_head_weight.dim() != 2 or lm_head_weight.shape[1] != dim or lm_head_weight.shape[0] == 0:
        raise ValueError(f"lm_head_weight must be [V, d] with d = {dim}, got shape {tuple(lm_head_weight.shape)}")
    for name, x in (("draft_hidden", draft_hidden), ("target_hidden", target_hidden), ("lm_head_weight", lm_head_weight)):
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor, got {x.dtype}")
    mask = _check_mask(mask, *draft_hidden.shape[:2], draft_hidden.device)
    return draft_hidden[mask].reshape(-1, dim), target_hidden.detach()[mask].reshape(-1, dim), mask


def _chunked_step_values(objective: str, draft_rows: torch.Tensor, target_rows: torch.Tensor,
                         lm_head_weight: torch.Tensor, label_rows: torch.Tensor | None, temperature: float,
                         chunk_rows: int | None, *, with_alpha: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`_step_values` of the rows' logits, `chunk_rows` rows at a time: rows [N, d] x2, labels [N] -> [N]; and,
    `with_alpha`, each row's acceptance α [N] (detached) from the same logits (else None)."""
    _check_temperature(temperature)
    if chunk_rows is not None and not (isinstance(chunk_rows, int) and chunk_rows >= 1):
        raise ValueError(f"chunk_rows must be a positive int or None, got {chunk_rows!r}")
    weight = lm_head_weight.detach()  # [V, d]
    rows = chunk_rows or max(1, CHUNK_ELEMENTS // weight.shape[0])
    values, alphas = [], []
    for i, (draft, target) in enumerate(zip(draft_rows.split(rows), target_rows.split(rows))):
        labels = None if label_rows is None else label_rows[i * rows:(i + 1) * rows]  # [R]
        # Non-reentrant checkpoint: forward frees the chunk's [R, V] logits; backward recomputes them.
        value, alpha = checkpoint(_rows_step_values, objective, draft, target, weight, labels, temperature,
                                  with_alpha, use_reentrant=False)  # [R], [R] | None
        values.append(value)
        alphas.append(alpha)
    return torch.cat(values), torch.cat(alphas) if with_alpha else None  # [N], [N] | None


def _rows_step_values(objective: str, draft_rows: torch.Tensor, target_rows: torch.Tensor, weight: torch.Tensor,
                      labels: torch.Tensor | None, temperature: float, with_alpha: bool
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk: rows [R, d] through the LM head W [V, d] (in W's dtype), then `_step_values` -> [R], and with
    `with_alpha` the acceptance α [R] of the same logits (the TV objectives' values themselves)."""
    draft_logits = F.linear(draft_rows.to(weight.dtype), weight)  # [R, V]
    target_logits = F.linear(target_rows.to(weight.dtype), weight)  # [R, V]
    values = _step_values(objective, draft_logits, target_logits, labels, temperature)
    if not with_alpha:
        return values, None
    if objective in ("tv", "e2e_tv"):
        return values, values.detach()
    with torch.no_grad():
        return values, _step_values("tv", draft_logits, target_logits, None, temperature)


def _step_values(objective: str, draft_logits: torch.Tensor, target_logits: torch.Tensor,
                 labels: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """Per (anchor, step): the loss for "ce" / "kl" / "rkl", the acceptance α for "tv" / "e2e_tv".
    logits [..., V] (target detached), labels [...] -> float32 [...]."""
    if objective == "ce":
        return _ce(draft_logits, labels, temperature)
    if objective == "kl":
        return _kl(draft_logits, target_logits, temperature)
    if objective == "rkl":
        return _rkl(draft_logits, target_logits, temperature)
    return tv_overlap_tiled(draft_logits, target_logits, temperature)


def _anchor_losses(objective: str, step_values: torch.Tensor) -> torch.Tensor:
    """Per anchor: [..., γ] step values (`_step_values`) -> [...] loss."""
    if objective == "tv":
        return (1.0 - step_values).mean(-1)
    if objective == "e2e_tv":
        return 1.0 - expected_accepted(step_values) / step_values.shape[-1]
    return step_values.mean(-1)


def _ce(draft_logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    draft_logp = logprobs_from_logits(draft_logits, temperature)  # [..., V]
    return -draft_logp.gather(-1, labels[..., None]).squeeze(-1)  # [...]


def _kl(draft_logits: torch.Tensor, target_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    target_logp = logprobs_from_logits(target_logits, temperature)  # [..., V]
    target_p = target_logp.exp()  # exact zeros stay zero: their terms vanish below
    draft_logp = logprobs_from_logits(draft_logits, temperature)
    return (target_p * (target_logp.clamp(min=LOG_PROB_FLOOR) - draft_logp)).sum(-1)  # [...]


def _rkl(draft_logits: torch.Tensor, target_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    target_logp = logprobs_from_logits(target_logits, temperature).clamp(min=LOG_PROB_FLOOR)  # [..., V]
    draft_logp = logprobs_from_logits(draft_logits, temperature)
    return (draft_logp.exp() * (draft_logp - target_logp)).sum(-1)  # [...]


def _check_logits(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> None:
    if draft_logits.dim() != 4:
        raise ValueError(f"draft_logits must be [B, T, γ, V], got shape {tuple(draft_logits.shape)}")
    if draft_logits.shape != target_logits.shape:
        raise ValueError(
            f"draft_logits shape {tuple(draft_logits.shape)} != target_logits shape {tuple(target_logits.shape)}"
        )
    if 0 in draft_logits.shape:
        raise ValueError(f"draft_logits has an empty dim: shape {tuple(draft_logits.shape)}")
    for name, x in (("draft_logits", draft_logits), ("target_logits", target_logits)):
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor, got {x.dtype}")


def _check_temperature(temperature: float) -> None:
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0 (use the rollout temperature), got {temperature!r}")


def _check_mask(mask: torch.Tensor | None, batch: int, anchors: int, device: torch.device) -> torch.Tensor:
    if mask is None:
        return torch.ones(batch, anchors, dtype=torch.bool, device=device)
    if mask.shape != (batch, anchors):
        raise ValueError(f"mask must have shape [B, T] = {(batch, anchors)}, got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")
    if not bool(mask.any()):
        raise ValueError("mask has no valid anchor: the loss would be an average over nothing")
    return mask


def _check_labels(labels: torch.Tensor | None, logits_shape: torch.Size, mask: torch.Tensor) -> torch.Tensor:
    if labels is None:
        raise ValueError('objective "ce" needs labels [B, T, γ] (the data tokens)')
    if labels.shape != logits_shape[:-1]:
        raise ValueError(f"labels must have shape [B, T, γ] = {tuple(logits_shape[:-1])}, got {tuple(labels.shape)}")
    if labels.is_floating_point() or labels.dtype == torch.bool or labels.is_complex():
        raise ValueError(f"labels must be an integer (long) tensor, got {labels.dtype}")
    vocab = logits_shape[-1]
    valid = labels[mask]  # [M, γ]
    if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= vocab):
        raise ValueError(
            f"labels at valid anchors must lie in [0, {vocab}), got range [{int(valid.min())}, {int(valid.max())}]"
        )
    # Masked anchors may hold padding (e.g. -100); any in-range index is fine there.
    return torch.where(mask[..., None], labels, torch.zeros_like(labels)).long()
