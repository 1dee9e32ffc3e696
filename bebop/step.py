"""The device work of one engine step, as three functions of tensors: `draft`, `verify_rows`, `catch_up`.

`bebop.engine` runs them eagerly, or each as one `torch.compile` graph (`Engine(compile=True)`). They take their
randomness as input, uniforms drawn by the engine from its explicit generator, so a graph holds the sampling,
the verification and the per-token statistics too, not only the forwards: what is left between graphs is the
engine's one host sync per step and its Python bookkeeping. Each mutates only the caches it is given (K/V
slots, `lengths`); none syncs with the host.

Uniforms per row and step, [B, n] float64 in [0, 1): for "rs" the first γ draw the drafts; the last γ + 1
decide acceptance and draw the next token (plain decoding: just that one).
"""

from __future__ import annotations

import torch

from bebop.kvcache import KVCache
from bebop.metrics import entropy
from bebop.sampling import probs_from_logits, sample
from bebop.verify import verify

Sampling = tuple[float, int | None, float | None]  # (temperature, top_k, top_p), as in bebop.sampling


def draft(model, mtp, logits: torch.Tensor, hidden: torch.Tensor, cache: KVCache, uniforms: torch.Tensor, *,
          kv_len: int, gamma: int, method: str, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gamma draft tokens [B, γ] from the head's step-1 logits [B, V] and hidden [B, 1, d], and for "rs" their
    draft distributions [B, γ, V]. Steps 2..γ run the head on its own output; `cache.lengths` ends where it began."""
    tokens, probs = [], []
    for k in range(gamma):
        draft_probs = probs_from_logits(logits, *sampling)  # [B, V]
        token = sample(draft_probs, uniform=uniforms[:, k]) if method == "rs" else draft_probs.argmax(-1)  # [B]
        tokens.append(token)
        probs.append(draft_probs)
        if k + 1 < gamma:
            # Step k+2 sits at position L + k: one past the previous draft query.
            _, hidden = mtp.forward_cached(model, hidden, token[:, None], cache, kv_len=kv_len, compute_logits=False)
            logits = mtp.logits(model, hidden)[:, 0]  # [B, V]
            cache.lengths += 1
    cache.lengths -= gamma - 1
    return torch.stack(tokens, 1), (torch.stack(probs, 1) if method == "rs" else None)


def verify_rows(model, pending: torch.Tensor, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                cache: KVCache, uniforms: torch.Tensor, *, kv_len: int, method: str, sampling: Sampling):
    """One target forward over [pending [B], drafts [B, γ]], then verification (or, at γ = 0, a plain draw).

    Returns (host [B, 3γ+3] float64: num_accepted, then emitted tokens, their log-probs and target entropies at
    the γ+1 positions, the one table the engine copies to the host; num_accepted [B]; next_token [B]; emitted
    [B, γ+1] (accepted drafts, then next_token repeated); hidden [B, γ+1, d]). The cache gets the γ+1 K/V entries
    but keeps its lengths."""
    batch, gamma = draft_tokens.shape
    uniforms = uniforms[:, uniforms.shape[1] - gamma - 1:]  # [B, γ+1] the verification's
    tokens = torch.cat([pending[:, None], draft_tokens], 1)  # [B, γ+1]
    logits, hidden = model.forward(tokens, cache, kv_len=kv_len)  # [B, γ+1, V], [B, γ+1, d]
    target_probs = probs_from_logits(logits, *sampling)  # [B, γ+1, V]
    if gamma > 0:
        verdict = verify(draft_tokens, target_probs, draft_probs, method=method, uniforms=uniforms, validate=False)
        num_accepted, next_token = verdict.num_accepted, verdict.next_token  # [B], [B]
    else:
        num_accepted = torch.zeros(batch, dtype=torch.long, device=tokens.device)
        next_token = sample(target_probs[:, 0], uniform=uniforms[:, 0])
    position = torch.arange(gamma + 1, device=tokens.device)  # [γ+1]
    padded = torch.cat([draft_tokens, next_token[:, None]], 1)  # [B, γ+1]
    emitted = torch.where(position < num_accepted[:, None], padded, next_token[:, None])  # [B, γ+1]
    logp = target_probs.gather(-1, emitted[..., None])[..., 0].log()  # [B, γ+1]
    ent = entropy(target_probs)  # [B, γ+1]
    host = torch.cat([num_accepted[:, None].double(), emitted.double(), logp.double(), ent.double()], 1)
    return host, num_accepted, next_token, emitted, hidden


def catch_up(model, mtp, hidden: torch.Tensor, emitted: torch.Tensor, num_accepted: torch.Tensor,
             cache: KVCache, draft_cache: KVCache, *, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Advance both caches by each row's num_accepted + 1 and catch the head up on the emitted tokens.

    The head's entry L+i pairs the target's h_{L+i} (hidden [B, γ+1, d]) with emitted token i (emitted [B, γ+1]);
    the entry at the row's accepted count is the next step-1 draft query, whose hidden [B, 1, d] and logits [B, V]
    are returned. Later entries are stale, overwritten later."""
    _, out = mtp.forward_cached(model, hidden, emitted, draft_cache, kv_len=kv_len, compute_logits=False)
    rows = torch.arange(emitted.shape[0], device=emitted.device)  # [B]
    draft_hidden = out[rows, num_accepted][:, None]  # [B, 1, d]
    draft_cache.lengths += num_accepted + 1
    cache.lengths += num_accepted + 1
    return draft_hidden, mtp.logits(model, draft_hidden)[:, 0]
