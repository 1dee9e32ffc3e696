"""`bebop bench step --cuts`: each cut of the verification measured on its own, the path before it beside the path
after it on the same tensors, in interleaved rounds (medians of per-round ratios).

  q over V          spreading the head's q from its draft vocabulary S over the target's vocabulary (before), or
                    not at all (after: q stays over S)
  p, entropy, logp  the target's softmax, its entropies by x·log x and the emitted tokens' log-probs from it (before),
                    or the log-normalisers and entropies from one pass of exponentials (after)
  verify            the acceptance tests and the residual at each row's deciding position: `bebop.verify.verify` on
                    softmaxes and q over V (before), `bebop.verify.verify_scores` on scores and q over S (after)
  ragged forward    the target forward over a rectangle of B·(γ+1) positions (before: every row at the deepest
                    depth), or over each row's own positions packed (after), half the rows at depth 0, half at γ
  rows out          a row leaving the batch (its answer finished): the survivors copied whole into a new cache
                    (before), or moved down in place through the slots written (after; `KVCache.keep`)
"""

from __future__ import annotations

import statistics
import time

import torch

from bebop.commands.bench.rounds import round_ratio, round_ratio_se
from bebop.draft_vocab import scatter_probs
from bebop.engine.ragged import layout_of, ragged_forward
from bebop.sampling import entropy, normaliser_and_entropy, probs_from_logits, sample, scaled_logits
from bebop.verify import Drafts, verify, verify_scores

GAMMA = 3


def _inputs(batch: int, vocab: int, draft_ids: torch.Tensor, temperature: float, generator: torch.Generator):
    logits = torch.randn(batch, GAMMA + 1, vocab, generator=generator) * 3  # [B, γ+1, V]
    draft_probs = probs_from_logits(torch.randn(batch, GAMMA, draft_ids.numel(), generator=generator) * 3,
                                    temperature)  # [B, γ, K]
    index = sample(draft_probs, generator)  # [B, γ]
    hats = draft_probs.gather(-1, index[..., None])[..., 0]
    drafts = Drafts(draft_ids[index], hats, torch.full((batch,), GAMMA), torch.zeros(batch, dtype=torch.bool),
                    draft_probs, draft_ids)
    return logits, drafts, torch.rand(batch, GAMMA + 1, dtype=torch.float64, generator=generator)


def cut_cells(batch: int, vocab: int, draft_ids: torch.Tensor, temperature: float) -> dict:
    """{(cut, "before" | "after"): zero-argument callable} on one set of tensors of SmolLM2's shapes."""
    logits, drafts, uniforms = _inputs(batch, vocab, draft_ids, temperature, torch.Generator().manual_seed(0))
    full_q = scatter_probs(drafts.draft_probs, draft_ids, vocab)
    probs = probs_from_logits(logits, temperature)
    scores = scaled_logits(logits.view(-1, vocab), temperature)
    lse, _ = normaliser_and_entropy(scores, masked=False)
    index = torch.arange(batch * (GAMMA + 1)).view(batch, GAMMA + 1)
    emitted = torch.cat([drafts.tokens, drafts.tokens[:, :1]], 1)  # [B, γ+1]

    def p_before():
        p = probs_from_logits(logits, temperature)
        return p.gather(-1, emitted[..., None]).log(), entropy(p)

    def p_after():
        s = scaled_logits(logits.view(-1, vocab), temperature)
        normaliser, ent = normaliser_and_entropy(s, masked=False)
        return s.flatten()[index * vocab + emitted] - normaliser[index], ent

    return {("q over V", "before"): lambda: scatter_probs(drafts.draft_probs, draft_ids, vocab),
            ("q over V", "after"): lambda: drafts.draft_probs,
            ("p, entropy, logp", "before"): p_before, ("p, entropy, logp", "after"): p_after,
            ("verify", "before"): lambda: verify(drafts.tokens, probs, full_q, uniforms=uniforms, validate=False),
            ("verify", "after"): lambda: verify_scores(scores, lse, index, drafts, uniforms)}


@torch.inference_mode()
def forward_cells(model, batch: int, context: int) -> dict:
    """{("ragged forward", "before" | "after"): callable}: the verify forward over B·(γ+1) positions, or over half
    the rows at depth 0 and half at γ packed."""
    cache = model.new_cache(batch, context + GAMMA + 2)
    cache.lengths.fill_(context)
    tokens = torch.zeros(batch, GAMMA + 1, dtype=torch.long, device=cache.device)
    widths = [1 if b % 2 else GAMMA + 1 for b in range(batch)]
    rectangle, ragged = layout_of([GAMMA + 1] * batch, batch, cache.device), layout_of(widths, batch, cache.device)
    kv = context + GAMMA + 1
    return {("ragged forward", "before"): lambda: ragged_forward(model, tokens, rectangle, cache, kv),
            ("ragged forward", "after"): lambda: ragged_forward(model, tokens, ragged, cache, kv)}


@torch.inference_mode()
def compaction_cells(model, batch: int, context: int, max_len: int) -> dict:
    """{("rows out", "before" | "after"): callable}: the middle row of `batch` leaving the target's cache of `max_len`
    slots per row, written through `context`: a new cache of the survivors, or the survivors moved down in place."""
    cache = model.new_cache(batch, max_len)
    cache.k.normal_(), cache.v.normal_()  # memory a running engine has touched, not zero pages
    whole = (cache.k, cache.v, cache.lengths)
    rows = [b for b in range(batch) if b != batch // 2]
    index = torch.tensor(rows, device=cache.device)

    def after():
        cache.k, cache.v, cache.lengths = whole  # the same rows leave every call: the views widened again
        cache.keep(rows, through=context)
        return cache.k, cache.v, cache.lengths

    return {("rows out", "before"): lambda: [x.index_select(1 if x.dim() > 1 else 0, index) for x in whole],
            ("rows out", "after"): after}


def time_cuts(cells: dict, repeats: int, calls: int = 5) -> dict:
    """{cut: (before ms, after ms, after / before, its standard error)} over interleaved rounds of `calls` calls."""
    seconds = {key: [] for key in cells}
    with torch.inference_mode():
        for fn in cells.values():  # warm-up
            fn()
        for _ in range(repeats):
            for key, fn in cells.items():
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                seconds[key].append((time.perf_counter() - start) / calls)
    out = {}
    for cut in dict.fromkeys(c for c, _ in cells):
        before, after = seconds[(cut, "before")], seconds[(cut, "after")]
        out[cut] = (1e3 * statistics.median(before), 1e3 * statistics.median(after), round_ratio(after, before),
                    round_ratio_se(after, before))
    return out


def print_cuts(batch: int, timed: dict) -> None:
    print(f"\nbatch {batch}: each cut on its own (ms per call, medians; after / before ± its standard error)")
    for cut, (before, after, ratio, se) in timed.items():
        print(f"  {cut:<20}{before:>10.2f}{after:>10.2f}{ratio:>10.2f} ± {se:.2f}")
