"""GRPO's math: group-normalised advantages, the clipped token-mean policy loss and its entropy bonus (pure
functions).

Group Relative Policy Optimisation samples G completions per prompt and scores each against its own
group, so no value network is needed:

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)          one advantage per completion

The policy loss is PPO's clipped surrogate on every generated token t of completion i, with the
importance ratio against the *behaviour* policy (the one that sampled the token; in async RL it is one
version older than the policy being updated):

    ρ_t = exp(log π_θ(y_t) - log π_behaviour(y_t))
    L   = - token-mean over all policy tokens of  min(ρ_t A_i, clip(ρ_t, 1-ε, 1+ε) A_i)
          + β · token-mean of k3(π_θ ‖ π_ref)     (optional KL to a frozen reference)
          - c · token-mean of H(π_θ(·| y_<t))     (optional entropy bonus, TRL's `entropy_coef`)

Token-mean (every policy token of the batch weighs the same, DAPO-style) rather than per-sequence mean
keeps long correct answers from being diluted. Tokens the policy did not write (environment replies in
agent rollouts, padding) carry mask False and contribute nothing. k3 = exp(d) - d - 1 with
d = log π_ref - log π_θ is Schulman's unbiased, always non-negative KL estimator.

The entropy bonus is the policy's own entropy at each position, H = -Σ_v π_θ(v) log π_θ(v) under the sampling
temperature, token-meaned over the same tokens and weights as the surrogate, so c means the same at any batch
size. Its gradient with respect to the logits z of a position (temperature T) is

    ∂H/∂z_v = -π_v (log π_v + H) / T

so c > 0 flattens every distribution the policy sampled from (raising entropy), c < 0 sharpens it. Who sets c
(a constant, or TRL's adaptive rule steering toward a target entropy) is `bebop.rl.entropy_control`'s business.
"""

from __future__ import annotations

import torch

from bebop.sampling import logprobs_from_logits


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """rewards [N] laid out group by group (N = groups · group_size) -> advantages [N].

    A group where every completion scored the same gets zero advantage: it carries no signal."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be a 1-D tensor, got shape {tuple(rewards.shape)}")
    if not isinstance(group_size, int) or group_size < 2:
        raise ValueError(f"group_size must be an int >= 2 (a group needs peers), got {group_size!r}")
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)  # [G, n]
    mean = grouped.mean(-1, keepdim=True)  # [G, 1]
    std = grouped.std(-1, keepdim=True, unbiased=False)  # [G, 1]
    return ((grouped - mean) / (std + eps)).view(-1)  # [N]


def groups_with_signal(rewards: torch.Tensor, group_size: int) -> float:
    """The share of groups whose completions did not all score the same: the only ones GRPO learns from (rewards
    [N] laid out group by group). 0 means the step's advantages are all 0 and its update leaves the policy as it was
    (a task the policy never solves, or always does)."""
    grouped = rewards.view(-1, group_size)  # [G, n]
    return float((grouped != grouped[:, :1]).any(-1).float().mean())


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0, *,
                   vocab_limit: int | None = None) -> torch.Tensor:
    """log softmax(logits / T) at `tokens`: logits [B, L, V], tokens [B, L] -> float32 [B, L].

    The same temperature and vocab_limit, through the same `bebop.sampling` function, as at rollout, so the ratio
    compares the distributions that were sampled."""
    if logits.dim() != 3 or logits.shape[:2] != tokens.shape:
        raise ValueError(f"logits must be [B, L, V] matching tokens [B, L]; got {tuple(logits.shape)}, "
                         f"{tuple(tokens.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for training log-probs, got {temperature}")
    logp = logprobs_from_logits(logits, temperature, vocab_limit=vocab_limit)  # [B, L, V]
    return logp.gather(-1, tokens[..., None])[..., 0]  # [B, L]


def token_entropy(logits: torch.Tensor, temperature: float = 1.0, *, vocab_limit: int | None = None) -> torch.Tensor:
    """H(softmax(logits / T)) per position, differentiable: logits [B, L, V] -> float32 [B, L] (nats).

    Through the same `bebop.sampling` function as `token_logprobs`; ids past `vocab_limit` have probability 0 and
    add nothing (their -inf log-probabilities are zeroed before the product, so the gradient stays finite)."""
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, L, V], got {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for training entropies, got {temperature}")
    logp = logprobs_from_logits(logits, temperature, vocab_limit=vocab_limit)  # [B, L, V]
    return -(logp.exp() * logp.masked_fill(logp.isneginf(), 0.0)).sum(-1)  # [B, L]


def grpo_loss(logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, *, clip_eps: float = 0.2, ref_logprobs: torch.Tensor | None = None,
              kl_coef: float = 0.0, num_tokens: int | torch.Tensor | None = None,
              entropies: torch.Tensor | None = None, entropy_coef: float = 0.0
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped token-mean GRPO loss, with an optional KL to a reference and an optional entropy bonus.

    logprobs [B, L] (current policy, differentiable), behaviour_logprobs [B, L] (from the Rollout),
    advantages [B], mask [B, L] bool (True = a token the policy generated), ref_logprobs [B, L] or None.
    num_tokens: the token-mean's denominator, default mask.sum(); a micro-batch passes the whole batch's
    count, so the losses (and stats) of its micro-batches add up to the whole batch's exactly.
    entropies [B, L] (`token_entropy` of the current policy, differentiable) or None: with them the loss subtracts
    entropy_coef · their token-mean, and the stats gain entropy_current (that token-mean) and entropy_bonus
    (entropy_coef times it, what was subtracted). Without them the loss and stats are exactly those of no bonus.
    Returns (loss scalar, detached stats: pg_loss, ppo_kl, clip_frac, kl_ref[, entropy_current, entropy_bonus])."""
    B, L = logprobs.shape
    for name, t in (("behaviour_logprobs", behaviour_logprobs), ("mask", mask), ("entropies", entropies)):
        if t is not None and t.shape != (B, L):
            raise ValueError(f"{name} must be [B, L]={B, L} like logprobs, got {tuple(t.shape)}")
    if advantages.shape != (B,):
        raise ValueError(f"advantages must be [B]={B}, got {tuple(advantages.shape)}")
    if not 0 < clip_eps < 1:
        raise ValueError(f"clip_eps must be in (0, 1), got {clip_eps}")
    if kl_coef < 0 or (kl_coef > 0 and ref_logprobs is None):
        raise ValueError(f"kl_coef must be >= 0, and > 0 needs ref_logprobs (got {kl_coef})")
    if entropy_coef != 0 and entropies is None:
        raise ValueError(f"entropy_coef {entropy_coef} needs entropies (token_entropy of the current policy)")
    denominator = mask.sum() if num_tokens is None else torch.as_tensor(num_tokens)
    weight = mask.float() / denominator.clamp(min=1)  # [B, L] token-mean weights
    log_ratio = logprobs - behaviour_logprobs.detach()  # [B, L]
    ratio = log_ratio.exp()
    adv = advantages.detach().float()[:, None]  # [B, 1]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)  # [B, L]
    pg_loss = -(surrogate * weight).sum()
    loss = pg_loss
    kl_ref = torch.zeros((), device=logprobs.device)
    if ref_logprobs is not None:
        d = ref_logprobs.detach() - logprobs  # [B, L]
        kl_ref = ((d.exp() - d - 1) * weight).sum()
        loss = loss + kl_coef * kl_ref
    with torch.no_grad():
        stats = {
            "pg_loss": pg_loss.detach(),
            "ppo_kl": (-log_ratio * weight).sum(),  # k1 estimate of KL(behaviour ‖ current)
            "clip_frac": (((ratio - 1).abs() > clip_eps).float() * weight).sum(),
            "kl_ref": kl_ref.detach(),
        }
    if entropies is not None:
        mean_entropy = (entropies * weight).sum()  # [] token-mean, over the same weights as the surrogate
        loss = loss - entropy_coef * mean_entropy
        stats["entropy_current"] = mean_entropy.detach()
        stats["entropy_bonus"] = entropy_coef * stats["entropy_current"]
    return loss, stats
