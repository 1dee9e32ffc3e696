"""A step's drafts as the verifier reads them (`bebop.verify.Drafts`): each row at its own depth, each from the MTP
head or from prompt lookup.

The engine's `Choice` says, per live row, how deep it drafts and whether by prompt lookup (`Choice.depths`,
`Choice.lookup`; None: every row at `Choice.gamma`, by the engine's one draft). The head drafts the deepest depth for
all rows at once (a row that drafts less, or by lookup, leaves the rest unread: the head's passes cost per position,
not per row); lookup proposals come from each row's own history and replace the head's drafts in their rows, with a
q that is one-hot at the draft. Rows that draft nothing (depth 0) decode plainly in the same verification. Padding
rows (`bebop.engine.buckets`) verify nothing.

Exact whatever the choice: a row's depth and source are fixed before its drafts are verified and read only what it
emitted before (its history, and q, a function of it), never the step's random numbers (bebop.engine.depth.rows).
"""

from __future__ import annotations

import torch

from bebop.engine.batch import Batch
from bebop.engine.depth import Choice
from bebop.engine.depth.rows import RowState
from bebop.engine.lookup import LookupIndex, PromptLookup
from bebop.engine.phases import tick
from bebop.engine.transfer import upload
from bebop.verify import Drafts


def by_slot(batch: Batch, values: list, fill) -> list:
    """Per tensor row (live rows at their slots, padding rows `fill`) the live rows' `values`."""
    out = [fill] * batch.capacity
    for slot, value in zip(batch.slots, values):
        out[slot] = value
    return out


def step_drafts(engine, batch: Batch, choice: Choice, config, uniforms: torch.Tensor, histories: Histories) -> Drafts:
    """The drafts of one step for `engine`'s batch: `choice`'s depths and sources, the head's drafts drawn with the
    step's `uniforms` (its draft columns), lookup proposals from the rows' `histories`."""
    device, capacity = engine.device, batch.capacity
    depths = choice.row_depths()
    gamma = max(depths, default=0)
    uniform = choice.depths is None or len(set(depths)) == 1
    depth_t = (torch.full((capacity,), gamma, dtype=torch.long, device=device) if uniform
               else upload(by_slot(batch, depths, 0), device))  # [P] (padding rows: the rectangle's, or none)
    if gamma == 0:
        empty = torch.empty(capacity, 0, dtype=torch.long, device=device)
        return Drafts(empty, empty.double(), depth_t, torch.ones(capacity, dtype=torch.bool, device=device))
    looked = list(choice.lookup) if choice.lookup is not None else [engine.lookup is not None] * len(depths)
    by_head = [i for i, (d, flag) in enumerate(zip(depths, looked)) if d > 0 and not flag]
    tokens, hats, probs = (None, None, None) if not by_head else _head_drafts(engine, batch, by_head, gamma, config,
                                                                                uniforms)
    if any(looked):
        tokens = _with_lookup(engine, batch, looked, gamma, tokens, histories)
    one_hot = torch.full((capacity,), config.method != "rs" or all(looked), dtype=torch.bool, device=device)
    if config.method == "rs" and any(looked) and not all(looked):
        one_hot = upload(by_slot(batch, looked, False), device, torch.bool)  # [P]
    ones = torch.ones(capacity, gamma, dtype=torch.float64 if hats is None else hats.dtype, device=device)
    hats = ones if hats is None else torch.where(one_hot[:, None], ones, hats)  # [P, G]
    return Drafts(tokens, hats, depth_t, one_hot, probs, None if probs is None else engine.mtp.draft_ids)


def _head_drafts(engine, batch: Batch, rows: list[int], gamma: int, config, uniforms: torch.Tensor):
    """The head's drafts, γ deep, for the live rows `rows` (indices into the batch): (tokens [P, γ], q(ŷ) [P, γ] |
    None, q [P, γ, K] | None), other rows' entries 0. With fewer rows than the batch's (others decode plainly or draft
    by lookup) the head runs on those rows alone, on a copy of their rows of its cache: a draft's cache writes are
    scratch (the next catch-up writes those slots), so nothing is copied back. CUDA graphs keep the whole batch."""
    clock = engine.phases
    cache, query, draws = batch.draft_cache, (batch.draft_logits, batch.draft_hidden), uniforms
    subset = len(rows) < batch.capacity and not engine.cudagraphs
    if subset:
        index = upload([batch.slots[i] for i in rows], engine.device)  # [R]
        cache, query, draws = cache.select(index), tuple(x[index] for x in query), uniforms[index]
    drafted = engine.draft_step(
        engine.model, engine.mtp, query, cache, draws,
        kv_len=engine.buckets.kv_len(max(batch.lengths) + gamma, cache.max_len), gamma=gamma,
        method=config.method, sampling=config.sampling, clock=None if engine.compiled else clock)
    tick(clock if engine.compiled else None, "compiled")
    if not subset:
        return drafted
    return tuple(None if x is None else x.new_zeros(batch.capacity, *x.shape[1:]).index_copy_(0, index, x)
                 for x in drafted)


def _with_lookup(engine, batch: Batch, looked: list[bool], gamma: int, tokens: torch.Tensor | None,
                 histories: Histories) -> torch.Tensor:
    """`tokens` [P, γ] with the rows that draft by prompt lookup holding its γ proposals (None: every row does;
    padding rows draft token 0)."""
    rows = [i for i, flag in enumerate(looked) if flag]
    proposals = upload([histories[batch.rows[i]].propose(gamma) for i in rows], engine.device)  # [L, γ]
    tick(engine.phases, "draft_lookup")
    if tokens is None and len(rows) == batch.capacity:
        return proposals
    if tokens is None:
        tokens = torch.zeros(batch.capacity, gamma, dtype=torch.long, device=engine.device)
    return tokens.index_copy(0, upload([batch.slots[i] for i in rows], engine.device), proposals)


ENTROPY_WINDOW = 8  # a row's recent entropy: the mean over its last this many policy tokens


class Histories:
    """Each row's prompt-lookup index over its history (prompt, then what `out` has appended), kept up to date one
    generate() call long: a lookup's match per row and step costs a few dictionary reads, not a scan."""

    def __init__(self, lookup: PromptLookup, out):
        self.lookup, self.out, self.index = lookup, out, {}

    def __getitem__(self, row: int) -> LookupIndex:
        index = self.index.get(row)
        if index is None:
            index = self.index[row] = LookupIndex(self.lookup)
            index.extend(self.out.prompts[row] if self.out.prompts is not None else [])
        done = len(index.tokens) - (len(self.out.prompts[row]) if self.out.prompts is not None else 0)
        index.extend(self.out.tokens[row][done:])
        return index


def row_states(batch: Batch, out, histories: Histories | None) -> list[RowState]:
    """What a per-row depth reads of each live row (bebop.engine.depth.rows): the mean target entropy of its last
    ENTROPY_WINDOW policy tokens, (with `histories`) prompt lookup's longest match ending its history, and the tokens
    left in its budget. Only what the rows emitted."""
    states = []
    for row in batch.rows:
        recent = [h for h, o in zip(out.entropy[row][-ENTROPY_WINDOW:], out.origin[row][-ENTROPY_WINDOW:])
                  if o != "env"]
        match = histories[row].match()[0] if histories is not None else 0
        left = out.config.max_new_tokens - len(out.tokens[row])
        states.append(RowState(sum(recent) / len(recent) if recent else 0.0, match, left))
    return states
