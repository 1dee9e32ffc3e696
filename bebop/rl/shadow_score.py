"""Scoring a draft head exactly on a batch of RL rollouts, teacher-forced (the math of `bebop.rl.shadow`).

At every anchor t of a completion (t ≥ prompt length - 1, its chain inside the row, every drafted token the
policy's), the head's step k (1..γ) drafts token t+k+1 from the backbone's hidden state at t and the rollout's
tokens t+1..t+k, and is verified against p_{t+k}, the policy's distribution at position t+k. Its acceptance is
exact, from the hidden states through the LM head (`bebop.losses_from_hidden.acceptances_from_hidden`):

    RS  α_k(t) = Σ_v min(p_{t+k}(v), q_k(t)(v))          TO  α_k(t) = p_{t+k}(argmax q_k(t))

A verify step starting at t accepts its i-th draft with probability Π_{j≤i} α_j(t) and reaches it with
Π_{j<i} α_j(t), so the counters of `bebop.metrics` (docs/runs.md) are their sums over the anchors: what the engine
would count from drafting at every anchor, in expectation, with the rollout's own tokens as the context.

    spec/num_drafts                          M, the anchors
    spec/num_accepted_tokens_per_pos/{i}     Σ_t Π_{j≤i} α_j(t)
    spec/num_reached_tokens_per_pos/{i}      Σ_t Π_{j<i} α_j(t)
    spec/by_entropy/{bin}/...                the same per bin of H(p_{t+i}) at the drafted position (reached,
                                             accepted, entropy × reached), the edges of `bebop.metrics`

so `bebop.metrics.derive` gives accept length 1 + Σ_j Π_{i≤j} α_i (averaged over anchors), α_i conditional on the
earlier drafts passing, and the entropy law's binned points, as it does for the engine's counters.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from bebop.draft_vocab import default_chunk_rows
from bebop.metrics import ENTROPY_BIN_EDGES, derive
from bebop.models.mtp import chain_targets
from bebop.sampling import entropy, probs_from_logits

RULES = ("rs", "to")
_INNER_EDGES = torch.tensor(ENTROPY_BIN_EDGES[1:-1], dtype=torch.float32)
NUM_BINS = len(ENTROPY_BIN_EDGES) - 1


def scored_anchors(tokens: torch.Tensor, lengths: torch.Tensor, prompt_lengths: torch.Tensor,
                   policy_mask: torch.Tensor, depth: int) -> torch.Tensor:
    """The anchors scored: bool [N, L] (module docstring). tokens [N, L]; lengths, prompt_lengths [N]; policy_mask
    [N, L-1] (True where target j, token j+1, is the policy's)."""
    N, L = tokens.shape
    _, _, inside = chain_targets(tokens[..., None].float(), tokens, depth, lengths)  # t + depth + 1 < length
    t = torch.arange(L, device=tokens.device)  # [L]
    completion = t[None, :] >= prompt_lengths.to(tokens.device)[:, None] - 1  # [N, L]
    # drafted tokens t+2..t+depth+1 are targets t+1..t+depth: each a token the policy wrote
    padded = F.pad(policy_mask, (0, depth + 1))  # [N, L + depth]
    drafted = padded.unfold(1, depth, 1)[:, 1:L + 1].all(-1)  # [N, L]
    return inside & completion & drafted


def position_entropy(hidden: torch.Tensor, weight: torch.Tensor, needed: torch.Tensor, temperature: float,
                     chunk_rows: int | None = None) -> torch.Tensor:
    """H(p) at the positions `needed` [N, L] bool (0 elsewhere): hidden [N, L, d] through the LM head weight [V, d],
    `chunk_rows` positions at a time (default: chunks of the losses' size, never an [N, L, V] tensor) -> float32
    [N, L]."""
    out = torch.zeros(needed.shape, dtype=torch.float32, device=hidden.device)  # [N, L]
    rows = hidden[needed]  # [P, d]
    chunk_rows = chunk_rows or default_chunk_rows(weight.shape[0])
    values = [entropy(probs_from_logits(F.linear(part.to(weight.dtype), weight), temperature))  # [R]
              for part in rows.split(chunk_rows)]
    if values:
        out[needed] = torch.cat(values).float()
    return out


def drafted_entropy(position_h: torch.Tensor, tokens: torch.Tensor, depth: int) -> torch.Tensor:
    """H(p_{t+k}) for every anchor t and step k: position_h [N, L] -> [N, L, depth]."""
    aligned, _, _ = chain_targets(position_h[..., None], tokens, depth)  # [N, L, depth, 1]
    return aligned[..., 0]


def expected_counters(alpha: torch.Tensor, drafted_h: torch.Tensor) -> torch.Tensor:
    """The counters of the module docstring as one float64 vector [2γ + 3·bins + 2] (summable over micro-batches
    and ranks): α [M, γ], drafted_h [M, γ] the entropy at each drafted position. Layout: accepted per position [γ],
    reached per position [γ], per bin reached / accepted / entropy × reached [3, bins], then M and Σ H."""
    M, depth = alpha.shape
    accepted = alpha.double().cumprod(-1)  # [M, γ] Π_{j≤i}
    reached = torch.cat([torch.ones_like(accepted[:, :1]), accepted[:, :-1]], -1)  # [M, γ] Π_{j<i}
    h = drafted_h.double()  # [M, γ]
    bins = torch.bucketize(drafted_h.float(), _INNER_EDGES.to(alpha.device), right=True).reshape(-1)  # [M·γ]
    source = torch.stack([reached, accepted, h * reached], -1).reshape(-1, 3)  # [M·γ, 3]
    per_bin = torch.zeros(NUM_BINS, 3, dtype=torch.float64, device=alpha.device).index_add_(0, bins, source)
    extra = torch.tensor([M, float(h.sum())], dtype=torch.float64, device=alpha.device)  # [2]
    return torch.cat([accepted.sum(0), reached.sum(0), per_bin.T.reshape(-1), extra])


def counters_record(vector: torch.Tensor, depth: int, rule: str) -> dict:
    """`expected_counters` (summed) as a shadow record's counters under the `bebop.metrics` names, with the rates
    `derive` gives (accept_length, acceptance_rate, alpha_pos/{i}) and entropy_mean (the mean H over every scored
    position, the same for every head and rule of a step)."""
    values = vector.tolist()
    accepted, reached = values[:depth], values[depth:2 * depth]
    per_bin = [values[2 * depth + k * NUM_BINS:2 * depth + (k + 1) * NUM_BINS] for k in range(3)]
    anchors, entropy_sum = values[-2], values[-1]
    record = {"spec/gamma": depth, "spec/method": rule, "spec/num_drafts": anchors,
              "spec/num_draft_tokens": anchors * depth, "spec/num_accepted_tokens": sum(accepted)}
    for i in range(depth):
        record[f"spec/num_accepted_tokens_per_pos/{i}"] = accepted[i]
        record[f"spec/num_reached_tokens_per_pos/{i}"] = reached[i]
    for k in range(NUM_BINS):
        if per_bin[0][k] > 0:  # empty bins say nothing: left out, as `pool` and `derive` allow
            for name, column in zip(("num_draft_tokens", "num_accepted_tokens", "entropy_sum"), per_bin):
                record[f"spec/by_entropy/{k}/{name}"] = column[k]
    rates = derive(record)
    record.update({"accept_length": rates["spec/accept_length"], "acceptance_rate": rates["spec/acceptance_rate"],
                   **{f"alpha_pos/{i}": rates[f"spec/alpha_pos/{i}"] for i in range(depth)},
                   "entropy_mean": entropy_sum / (anchors * depth) if anchors > 0 else math.nan})
    return record
