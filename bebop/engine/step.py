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
from bebop.models.kvcache import KVCache
from bebop.sampling import entropy, probs_from_logits, sample
from bebop.verify import verify

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
    verified_entropies: list[float]  # H(p_1..p_γ) at the γ verified positions, emitted or not (SpecCounters)


def unpack_host_row(row: list[float], gamma: int) -> StepRow:
    """The inverse of `pack_host_table` for one row (a list from the table's `.tolist()`)."""
    n, width = int(row[0]), gamma + 1
    emitted, logprobs, entropies = (row[1 + i * width : 1 + (i + 1) * width] for i in range(3))  # γ+1 each
    return StepRow(n, [int(t) for t in emitted[: n + 1]], logprobs[: n + 1], entropies[: n + 1], entropies[:gamma])


def draft(model, mtp, logits: torch.Tensor, hidden: torch.Tensor, cache: KVCache, uniforms: torch.Tensor, *,
          kv_len: int, gamma: int, method: str, sampling: Sampling,
          clock: PhaseClock | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gamma draft tokens [B, γ] from the head's step-1 logits [B, K] and hidden [B, 1, d], and for "rs" their
    draft distributions [B, γ, V]. Steps 2..γ run the head on its own output; `cache.lengths` ends where it began.

    A head with a draft vocabulary S (K < V) samples (or takes the argmax) among S's K tokens and its q is
    spread over V with zeros off S: the q verified is the q sampled from. S's ids all lie below the vocab limit
    (`check_request`), so over S the limit has nothing left to mask."""
    tokens, probs = [], []
    uniforms = draft_uniforms(uniforms, gamma)  # [B, γ]
    on_s = (*sampling[:3], None) if mtp.draft_ids is not None else sampling
    for k in range(gamma):
        draft_probs = probs_from_logits(logits, *on_s)  # [B, K]
        index = sample(draft_probs, uniform=uniforms[:, k]) if method == "rs" else draft_probs.argmax(-1)  # [B]
        token = mtp.to_target(index)  # [B] target ids
        tokens.append(token)
        probs.append(draft_probs)
        tick(clock, "draft_sample")
        if k + 1 < gamma:
            # Step k+2 sits at position L + k: one past the previous draft query.
            _, hidden = mtp.forward_cached(model, hidden, token[:, None], cache, kv_len=kv_len, compute_logits=False)
            logits = mtp.logits(model, hidden)[:, 0]  # [B, K]
            cache.lengths += 1
            tick(clock, "draft_forward")
    cache.lengths -= gamma - 1
    full = mtp.full_probs(torch.stack(probs, 1)) if method == "rs" else None
    tick(clock, "draft_scatter")
    return torch.stack(tokens, 1), full


def verify_rows(model, pending: torch.Tensor, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                cache: KVCache, uniforms: torch.Tensor, *, kv_len: int, method: str, sampling: Sampling,
                clock: PhaseClock | None = None):
    """One target forward over [pending [B], drafts [B, γ]], then verification (or, at γ = 0, a plain draw).

    Returns (host [B, 3γ+4] float64, the table of `pack_host_table`; num_accepted [B]; next_token [B]; emitted
    [B, γ+1] (accepted drafts, then next_token repeated); hidden [B, γ+1, d]). The cache gets the γ+1 K/V entries
    but keeps its lengths."""
    batch, gamma = draft_tokens.shape
    uniforms = verify_uniforms(uniforms, gamma)  # [B, γ+1]
    tokens = torch.cat([pending[:, None], draft_tokens], 1)  # [B, γ+1]
    _, hidden = model.forward(tokens, cache, kv_len=kv_len, compute_logits=False)  # [B, γ+1, d]
    tick(clock, "verify_forward")
    logits = model.lm_logits(hidden)  # [B, γ+1, V]
    tick(clock, "verify_lm_head")
    target_probs = probs_from_logits(logits, *sampling)  # [B, γ+1, V]
    tick(clock, "target_probs")
    if gamma > 0:
        verdict = verify(draft_tokens, target_probs, draft_probs, method=method, uniforms=uniforms, validate=False,
                         clock=clock)
        num_accepted, next_token = verdict.num_accepted, verdict.next_token  # [B], [B]
    else:
        num_accepted = torch.zeros(batch, dtype=torch.long, device=tokens.device)
        next_token = sample(target_probs[:, 0], uniform=uniforms[:, 0])
    tick(clock, "next_token")
    position = torch.arange(gamma + 1, device=tokens.device)  # [γ+1]
    padded = torch.cat([draft_tokens, next_token[:, None]], 1)  # [B, γ+1]
    emitted = torch.where(position < num_accepted[:, None], padded, next_token[:, None])  # [B, γ+1]
    logp = target_probs.gather(-1, emitted[..., None])[..., 0].log()  # [B, γ+1]
    ent = entropy(target_probs)  # [B, γ+1]
    host = pack_host_table(num_accepted, emitted, logp, ent)
    tick(clock, "stats")
    return host, num_accepted, next_token, emitted, hidden


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


def graphed(fn):
    """`fn` compiled into CUDA graphs, its outputs cloned out of the graphs' memory, which the next replay reuses.

    Compiled under two settings that keep the graphs to one per phase and sampling setting (tests/test_cuda_wiring):
    Python floats (temperature, top-p) are compiled in as constants, one graph per value (left symbolic, each would
    enter the graph as a CPU scalar tensor, and inductor does not replay a graph with a CPU input as a CUDA graph);
    and sizes that happen to be equal get no shared symbol ("duck shapes"): a row bucket equal to the kv heads or
    to the step's width would tie the two, then fix both, and the next bucket would compile again."""
    compiled = torch.compile(fn, dynamic=True, mode="reduce-overhead")

    def run(*args, **kwargs):
        with torch._dynamo.config.patch(specialize_float=True), fx_config.patch(use_duck_shape=False):
            return tree_map_only(torch.Tensor, torch.clone, compiled(*args, **kwargs))
    return run
