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
`bebop.losses_from_hidden` takes the hidden states and the LM head instead (all of it in row chunks, or a draft
vocabulary's rows exactly); it builds on `step_values` and `anchor_losses` here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from bebop.checks import OBJECTIVES
from bebop.sampling import logprobs_from_logits
from bebop.tv_tiled import tv_overlap_tiled

# Target log-probabilities are clamped below at this value (nats) inside "kl" and "rkl". A target
# logit of -inf (e.g. a token removed by top-k) gives p = 0 exactly; reverse KL is then infinite
# wherever q > 0. e^-100 ≈ 4e-44 is already below the smallest normal float32, so the clamp only
# touches probabilities float32 cannot tell from zero, and caps their cost at 100 nats per unit of
# q mass: large, finite, and with the gradient formula of the table unchanged.
LOG_PROB_FLOOR = -100.0


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
    check_temperature(temperature)
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
    check_temperature(temperature)
    batch, anchors = draft_logits.shape[:2]
    mask = check_mask(mask, batch, anchors, draft_logits.device)
    labels = check_labels(labels, draft_logits.shape, mask) if objective == "ce" else None
    values = step_values(objective, draft_logits, target_logits.detach(), labels, temperature)  # [B, T, γ]
    per_anchor = anchor_losses(objective, values)  # [B, T]
    # where(), not a product: a masked anchor's value never reaches the sum, nor its gradient.
    per_anchor = torch.where(mask, per_anchor, torch.zeros_like(per_anchor))  # [B, T]
    return per_anchor.sum() / mask.sum()


def step_values(objective: str, draft_logits: torch.Tensor, target_logits: torch.Tensor,
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


def anchor_losses(objective: str, values: torch.Tensor) -> torch.Tensor:
    """Per anchor: [..., γ] step values (`step_values`) -> [...] loss."""
    if objective == "tv":
        return (1.0 - values).mean(-1)
    if objective == "e2e_tv":
        return 1.0 - expected_accepted(values) / values.shape[-1]
    return values.mean(-1)


def step_values_on_vocab(objective: str, draft_logits: torch.Tensor, target_logp: torch.Tensor,
                         labels: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """`step_values` for a draft over a draft vocabulary S (docs/paper.md, "A draft vocabulary"): draft_logits
    [..., K] (q = softmax over S), target_logp [..., K] the target's exact log p on S, not renormalised (their
    mass is p(S) ≤ 1; `bebop.draft_vocab.target_logp`), labels [...] as indices into S, -1 where the data token
    lies outside S -> float32 [...].

        "tv", "e2e_tv"  α = Σ_S min(p, q): exactly the RS acceptance, since q = 0 off S
        "kl"            Σ_S p log(p/q): p(S)·KL(p/p(S) ‖ q) + a constant, minimised at q = p/p(S)
        "rkl"           Σ_S q log(q/p): KL(q ‖ p) over the whole vocabulary, exactly
        "ce"            -log q(y), and 0 where y is outside S (no q over S can draft it)
    """
    draft_logp = logprobs_from_logits(draft_logits, temperature)  # [..., K]
    if objective == "ce":
        inside = labels >= 0
        picked = draft_logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0]  # [...]
        return torch.where(inside, -picked, torch.zeros_like(picked))
    target_logp = target_logp.detach().float()
    if objective == "kl":
        return (target_logp.exp() * (target_logp - draft_logp)).sum(-1)
    if objective == "rkl":
        return (draft_logp.exp() * (draft_logp - target_logp.clamp(min=LOG_PROB_FLOOR))).sum(-1)
    return torch.minimum(target_logp.exp(), draft_logp.exp()).sum(-1)


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


def check_temperature(temperature: float) -> None:
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0 (use the rollout temperature), got {temperature!r}")


def check_mask(mask: torch.Tensor | None, batch: int, anchors: int, device: torch.device) -> torch.Tensor:
    if mask is None:
        return torch.ones(batch, anchors, dtype=torch.bool, device=device)
    if mask.shape != (batch, anchors):
        raise ValueError(f"mask must have shape [B, T] = {(batch, anchors)}, got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")
    if not bool(mask.any()):
        raise ValueError("mask has no valid anchor: the loss would be an average over nothing")
    return mask


def check_labels(labels: torch.Tensor | None, logits_shape: torch.Size, mask: torch.Tensor) -> torch.Tensor:
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
