"""`bebop bench step --cuts`: each cut of the verification measured on its own, the path before it beside the path
after it on the same tensors, in interleaved rounds (medians of per-round ratios).

  q over V          spreading the head's q from its draft vocabulary S over the target's vocabulary (before), or
                    not at all (after: q stays over S)
  p, entropy, logp  the target's softmax, its entropies by x·log x and the emitted tokens' log-probs from it (before),
                    or the log-normalisers and entropies from one pass of exponentials (after)
  verify            the acceptance tests and the residual at each row's deciding position: `bebop.verify.verify` on
                    softmaxes and q over V (before), `bebop.verify.verify_scores` on scores and q over S (after)
  p in blocks       the scores, log-normalisers and entropies of every verified position over the whole [N, V] tensor
                    (before), or a block of positions at a time, whose passes stay in cache (after:
                    `bebop.sampling.scores_normaliser_entropy`)
  draw              a row's token from its weights over V (each row's plain draw, bonus or residual): one float64
                    scan over the row (before), or the scan over blocks' sums, then inside one block (after:
                    `bebop.sampling.draw_by_blocks`)
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
from bebop.sampling import (draw_by_blocks, draw_by_scan, entropy, normaliser_and_entropy, probs_from_logits, sample,
                            scaled_logits, scores_normaliser_entropy)
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
    flat = logits.view(-1, vocab).bfloat16()  # [B·(γ+1), V] as the LM head gives them on a bf16 CPU
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
            ("verify", "after"): lambda: verify_scores(scores, lse, index, drafts, uniforms),
            ("p in blocks", "before"): lambda: normaliser_and_entropy(scaled_logits(flat, temperature), masked=False),
            ("p in blocks", "after"): lambda: scores_normaliser_entropy(flat, temperature),
            ("draw", "before"): lambda: draw_by_scan(probs[:, 0], uniforms[:, :1]),
            ("draw", "after"): lambda: draw_by_blocks(probs[:, 0], uniforms[:, :1])}


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
    """{cut: (before ms, after ms, after / before, its standard error)} over interleaved rounds of `calls` calls.

    Each timed batch of calls follows an untimed call of the same cell, and a cut's two paths swap places every
    round: timed right after another cell, a path would pay for the caches that cell left (the second of a pair, on
    the first's still-warm tensors, measured 0.62x the first when both ran the same code)."""
    seconds = {key: [] for key in cells}
    cuts = list(dict.fromkeys(c for c, _ in cells))
    with torch.inference_mode():
        for round_index in range(repeats):
            sides = ("before", "after") if round_index % 2 == 0 else ("after", "before")
            for key in [(cut, side) for cut in cuts for side in sides]:
                cells[key]()  # warm, untimed
                start = time.perf_counter()
                for _ in range(calls):
                    cells[key]()
                seconds[key].append((time.perf_counter() - start) / calls)
    out = {}
    for cut in cuts:
        before, after = seconds[(cut, "before")], seconds[(cut, "after")]
        out[cut] = (1e3 * statistics.median(before), 1e3 * statistics.median(after), round_ratio(after, before),
                    round_ratio_se(after, before))
    return out


def print_cuts(batch: int, timed: dict) -> None:
    print(f"\nbatch {batch}: each cut on its own (ms per call, medians; after / before ± its standard error)")
    for cut, (before, after, ratio, se) in timed.items():
        print(f"  {cut:<20}{before:>10.2f}{after:>10.2f}{ratio:>10.2f} ± {se:.2f}")
