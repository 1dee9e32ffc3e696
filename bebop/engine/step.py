"""The device work of one engine step, as three functions of tensors: `draft`, `verify_rows`, `catch_up`.

`bebop.engine` runs them eagerly, or each as one `torch.compile` graph (`Engine(compile=True)`). They take their
randomness as input, uniforms drawn by `draw_uniforms` from the engine's explicit generator, so a graph holds the
sampling, the verification and the per-token statistics too, not only the forwards: what is left between graphs is
the engine's one host sync per step and its Python bookkeeping. Each mutates only the caches it is given (K/V
slots, `lengths`); none syncs with the host.

This module owns the two layouts it shares with the engine, each written and read side by side here:

  uniforms    [B, n] float64 in [0, 1), one column per sampling decision in the order the decisions are made
              (`draw_uniforms`; read by `draft_uniforms` and `verify_uniforms`):
                  "rs"      [γ drafts | γ acceptance tests | 1 next token]      n = 2γ + 1
                  "to"      [γ acceptance tests | 1 next token]                 n = γ + 1
                  "greedy"  zeros [γ + 1]: prefix matching draws nothing
                  plain     [1 next token] (γ = 0, any method)                  n = 1
  host table  [B, 3γ+4] float64, the one table the engine copies to the host per step (`pack_host_table`;
              read back one row at a time by `unpack_host_row`):
                  [num_accepted | emitted tokens (γ+1) | their log-probs (γ+1) | target entropies (γ+1)]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx.experimental import _config as fx_config
from torch.utils._pytree import tree_map_only

from bebop.engine.phases import PhaseClock, tick
from bebop.engine.ragged import Layout, ragged_forward, rectangle_hidden
from bebop.models.kvcache import KVCache
from bebop.sampling import probs_from_logits, sample, scores_normaliser_entropy
from bebop.verify import Drafts, verify_scores

# (temperature, top_k, top_p, vocab_limit): GenerationConfig.sampling, the arguments of bebop.sampling.scaled_logits
Sampling = tuple[float, int | None, float | None, int | None]


def draw_uniforms(rows: int, gamma: int, method: str, generator: torch.Generator,
                  device: torch.device) -> torch.Tensor:
    """[B, n] float64, a step's random numbers in the layout of the module docstring: one draw call per decision
    group, in the order the decisions are made (each "rs" draft, the acceptance tests, the next token), i.e. what
    sampling from the generator at each decision consumes, so a seeded run is the same eagerly and compiled."""
    if gamma > 0 and method == "greedy":  # prefix matching draws nothing
        return torch.zeros(rows, gamma + 1, dtype=torch.float64, device=device)
    draws = [1] * gamma if method == "rs" else []
    draws += [gamma, 1] if gamma > 0 else [1]
    return torch.cat([torch.rand(rows, n, dtype=torch.float64, device=device, generator=generator)
                      for n in draws], 1)


def draft_uniforms(uniforms: torch.Tensor, gamma: int) -> torch.Tensor:
    """The "rs" drafts' uniforms [B, γ] (column k draws draft k); meaningless for any other method."""
    return uniforms[:, :gamma]


def verify_uniforms(uniforms: torch.Tensor, gamma: int) -> torch.Tensor:
    """The verification's uniforms [B, γ+1]: the γ acceptance tests, then the next token (the last columns)."""
    return uniforms[:, uniforms.shape[1] - gamma - 1:]


def pack_host_table(num_accepted: torch.Tensor, emitted: torch.Tensor, logprobs: torch.Tensor,
                    entropies: torch.Tensor) -> torch.Tensor:
    """The host table [B, 3γ+4] float64 from num_accepted [B], emitted [B, γ+1], their log-probs [B, γ+1] and the
    target entropies [B, γ+1]. float64 holds every token id exactly, so one table (one copy) carries them all."""
    return torch.cat([num_accepted[:, None].double(), emitted.double(), logprobs.double(), entropies.double()], 1)


@dataclass(frozen=True)
class StepRow:
    """One row of the host table, cut to what the row emitted: its num_accepted + 1 tokens."""

    num_accepted: int
    tokens: list[int]  # accepted drafts, then the recovered or bonus token
    logprobs: list[float]  # log p(token) under the processed target distribution
    entropies: list[float]  # H(p) in nats at each emitted position
    verified_entropies: list[float]  # H(p_1..p_d) at the row's d verified positions, emitted or not (SpecCounters)


def unpack_host_row(row: list[float], gamma: int, depth: int | None = None) -> StepRow:
    """The inverse of `pack_host_table` for one row (a list from the table's `.tolist()`) of a step of width γ + 1
    whose row verified `depth` drafts (default γ)."""
    n, width = int(row[0]), gamma + 1
    emitted, logprobs, entropies = (row[1 + i * width : 1 + (i + 1) * width] for i in range(3))  # γ+1 each
    verified = entropies[: gamma if depth is None else depth]
    return StepRow(n, [int(t) for t in emitted[: n + 1]], logprobs[: n + 1], entropies[: n + 1], verified)


def draft(model, mtp, query: tuple[torch.Tensor, torch.Tensor], cache: KVCache, uniforms: torch.Tensor, *,
          kv_len: int, gamma: int, method: str, sampling: Sampling, clock: PhaseClock | None = None
          ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """gamma draft tokens [B, γ] from the head's step-1 query (its logits [B, K] and hidden [B, 1, d]); for "rs"
    q at each draft, q(ŷ) [B, γ], and q itself over the head's draft vocabulary [B, γ, K] (for the others q is a
    one-hot at the draft: None, None). Steps 2..γ run the head on its own output; `cache.lengths` ends where it began.

    q stays where the head drafted it: over its draft vocabulary S (K < V) it is never spread over V, the verifier
    reads it there (`bebop.verify.verify_scores`). S's ids all lie below the vocab limit (`check_request`), so over S
    the limit has nothing left to mask."""
    (logits, hidden), tokens, probs, hats = query, [], [], []
    uniforms = draft_uniforms(uniforms, gamma)  # [B, γ]
    on_s = (*sampling[:3], None) if mtp.draft_ids is not None else sampling
    for k in range(gamma):
        draft_probs = probs_from_logits(logits, *on_s)  # [B, K]
        if method == "rs":
            index = sample(draft_probs, uniform=uniforms[:, k])  # [B]
            hats.append(draft_probs.gather(-1, index[:, None])[:, 0])  # [B] q(ŷ)
            probs.append(draft_probs)
        else:
            index = draft_probs.argmax(-1)  # [B]
        token = mtp.to_target(index)  # [B] target ids
        tokens.append(token)
        tick(clock, "draft_sample")
        if k + 1 < gamma:
            # Step k+2 sits at position L + k: one past the previous draft query.
            _, hidden = mtp.forward_cached(model, hidden, token[:, None], cache, kv_len=kv_len, compute_logits=False)
            logits = mtp.logits(model, hidden)[:, 0]  # [B, K]
            cache.lengths += 1
            tick(clock, "draft_forward")
    cache.lengths -= gamma - 1
    if method != "rs":
        return torch.stack(tokens, 1), None, None
    return torch.stack(tokens, 1), torch.stack(hats, 1), torch.stack(probs, 1)


def verify_rows(model, pending: torch.Tensor, drafts: Drafts, cache: KVCache, uniforms: torch.Tensor, *,
                kv_len: int, method: str, sampling: Sampling, layout: Layout, clock: PhaseClock | None = None):
    """One target forward over [pending [B], drafts.tokens [B, G]] at the positions `layout` computes (each row
    its pending token and its own drafts.depths[b] drafts), then verification (`bebop.verify.verify_scores`).

    The target's law enters through its scaled logits and their log-normalisers only: p at a draft is
    exp(score - log-normaliser), the full distribution is formed at one position per row (the deciding one), and
    each position's entropy comes from the same exponentials (`scores_normaliser_entropy`, a block of positions
    at a time).

    Returns (host [B, 3G+4] float64, the table of `pack_host_table`; num_accepted [B]; next_token [B]; emitted
    [B, G+1] (accepted drafts, then next_token repeated); hidden [B, G+1, d], or with the layout's taps (a fused
    head's feature layers) the features [B, G+1, (1 + n) d] it reads, zero past a row's width). The cache
    gets the computed positions' K/V but keeps its lengths."""
    batch, gamma = drafts.tokens.shape
    uniforms = verify_uniforms(uniforms, gamma)  # [B, G+1]
    tokens = torch.cat([pending[:, None], drafts.tokens], 1)  # [B, G+1]
    hidden = ragged_forward(model, tokens, layout, cache, kv_len)  # [N, d] or [N, (1 + n) d]
    tick(clock, "verify_forward")
    logits = model.lm_logits(hidden)  # [N, V]
    tick(clock, "verify_lm_head")
    scores, log_normaliser, entropies = scores_normaliser_entropy(logits, *sampling)  # [N, V], [N], [N]
    tick(clock, "target_probs")
    verdict = verify_scores(scores, log_normaliser, layout.index, drafts, uniforms, method, clock=clock)
    num_accepted, next_token = verdict.num_accepted, verdict.next_token  # [B], [B]
    tick(clock, "next_token")
    position = torch.arange(gamma + 1, device=tokens.device)  # [G+1]
    padded = torch.cat([drafts.tokens, next_token[:, None]], 1)  # [B, G+1]
    emitted = torch.where(position < num_accepted[:, None], padded, next_token[:, None])  # [B, G+1]
    index = layout.index  # [B, G+1]
    logp = scores.flatten()[index * scores.shape[1] + emitted] - log_normaliser[index]  # [B, G+1]
    host = pack_host_table(num_accepted, emitted, logp, entropies[index])
    tick(clock, "stats")
    return host, num_accepted, next_token, emitted, rectangle_hidden(hidden, layout)


def catch_up(model, mtp, hidden: torch.Tensor, emitted: torch.Tensor, num_accepted: torch.Tensor,
             cache: KVCache, draft_cache: KVCache, *, kv_len: int,
             clock: PhaseClock | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Advance both caches by each row's num_accepted + 1 and catch the head up on the emitted tokens.

    The head's entry L+i pairs the target's h_{L+i} (hidden [B, γ+1, d]) with emitted token i (emitted [B, γ+1]);
    the entry at the row's accepted count is the next step-1 draft query, whose hidden [B, 1, d] and logits [B, V]
    are returned ([B, K] over the head's draft vocabulary). Later entries are stale, overwritten later."""
    _, out = mtp.forward_cached(model, hidden, emitted, draft_cache, kv_len=kv_len, compute_logits=False)
    tick(clock, "draft_forward")
    rows = torch.arange(emitted.shape[0], device=emitted.device)  # [B]
    draft_hidden = out[rows, num_accepted][:, None]  # [B, 1, d]
    draft_cache.lengths += num_accepted + 1
    cache.lengths += num_accepted + 1
    tick(clock, "advance")
    logits = mtp.logits(model, draft_hidden)[:, 0]  # [B, K]
    tick(clock, "draft_forward")
    return draft_hidden, logits


def compiled(fn, options: dict | None = None, mode: str | None = None):
    """`fn` as torch.compile graphs with symbolic sizes, sizes that happen to be equal given no shared symbol ("duck
    shapes"): a row count equal to the kv heads or to the step's width (γ + 1) would tie the two, then fix both, and
    the next batch would compile again."""
    graph = torch.compile(fn, dynamic=True, options=options, mode=mode)

    def run(*args, **kwargs):
        with fx_config.patch(use_duck_shape=False):
            return graph(*args, **kwargs)
    return run


def graphed(fn):
    """`fn` compiled into CUDA graphs, its outputs cloned out of the graphs' memory, which the next replay reuses.

    `compiled`'s graphs (no duck shapes), with Python floats (temperature, top-p) compiled in as constants, which
    keeps the graphs to one per phase and sampling setting (tests/test_cuda_wiring): left symbolic, each would enter
    the graph as a CPU scalar tensor, and inductor does not replay a graph with a CPU input as a CUDA graph."""
    graph = compiled(fn, mode="reduce-overhead")

    def run(*args, **kwargs):
        with torch._dynamo.config.patch(specialize_float=True):
            return tree_map_only(torch.Tensor, torch.clone, graph(*args, **kwargs))
    return run
