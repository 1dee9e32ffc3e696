"""The active rows of a generation and their device state (`Batch`), and the feeds' host->device layout.

The tensors have P >= B rows (`bebop.engine.buckets`): active row i lives in tensor row `slots[i]`, the other
rows are padding. Unpadded (`Buckets.exact()`), P = B and slots = 0..B-1 always: a finished row is dropped at once.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch

from bebop.engine.buckets import Buckets, CachePool
from bebop.engine.transfer import upload
from bebop.models.kvcache import KVCache


@dataclass
class Batch:
    rows: list[int]  # original prompt index of each active row
    lengths: list[int]  # host copy of the target cache length per row (bounds checks without a sync)
    slots: list[int]  # the tensor row of each active row
    pending: torch.Tensor  # [P] the token at position `lengths`, not yet in the target cache
    cache: KVCache
    draft_cache: KVCache | None = None
    draft_logits: torch.Tensor | None = None  # [P, K] the head's step-1 logits for the next draft (K = V without S)
    draft_hidden: torch.Tensor | None = None  # [P, 1, d] the head's step-1 output hidden
    # gamma="auto": (target hidden [P, 1, d], emitted token [P, 1]) of each plain step since the head's cache was
    # last caught up; the head's cache and draft_* are stale while this is not empty (HeadCache.catch_up)
    head_lag: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @property
    def capacity(self) -> int:
        return self.pending.shape[0]

    def keep(self, buckets: Buckets, pool: CachePool | None, owners: tuple, keep: list[int],
             through: int | None = None) -> torch.Tensor | None:
        """Keep the active rows `keep` (indices into `rows`). The others become padding, unless the survivors fit a
        smaller capacity: then the batch is compacted (into `pool`'s caches, if any; `owners` = (model, head)) and
        the tensor rows it kept ([P'] long, for the step's other tensors) are returned; else None. `through`: the
        cache slots any row has written (this step's included), for a compaction in place (`KVCache.keep`)."""
        slots = [self.slots[i] for i in keep]
        self.rows, self.lengths = [self.rows[i] for i in keep], [self.lengths[i] for i in keep]
        capacity = buckets.capacity(len(keep))
        if not keep or capacity == self.capacity:
            self.slots = slots
            return None
        taken = set(slots)
        padding = [s for s in range(self.capacity) if s not in taken][: capacity - len(slots)]
        order = slots + padding
        index = upload(order, self.pending.device)  # [P']
        self.slots = list(range(len(slots)))
        self.pending = self.pending[index]
        self.cache = _compact(pool, owners[0], self.cache, index, order, through)
        if self.draft_cache is not None:
            self.draft_cache = _compact(pool, owners[1], self.draft_cache, index, order, through)
            self.draft_logits, self.draft_hidden = self.draft_logits[index], self.draft_hidden[index]
            self.head_lag = [(hidden[index], tokens[index]) for hidden, tokens in self.head_lag]
        return index


def _compact(pool: CachePool | None, owner: torch.nn.Module, cache: KVCache, index: torch.Tensor, order: list[int],
             through: int | None) -> KVCache:
    if pool is None:
        cache.keep(order, through)
        return cache
    out = pool.get(owner, index.numel(), cache.max_len)
    cache.copy_rows_to(index, out)
    return out


def pad_feeds(feeds: list[tuple[int, int, list[int]]], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The feeds' token runs right-padded with 0 [F, W], their start positions [F] and last indices [F]."""
    width = max(len(t) for _, _, t in feeds)
    tokens = upload([feed + [0] * (width - len(feed)) for _, _, feed in feeds], device)
    starts = upload([s for _, s, _ in feeds], device)
    last = upload([len(t) - 1 for _, _, t in feeds], device)
    return tokens, starts, last


def shared_runs(feeds: list[tuple[int, int, list[int]]]) -> tuple[list[int], list[int]]:
    """Which feeds to prefill and where every feed's K/V comes from: (the feeds to run: the first of each prompt
    that several feeds share, every other feed once; for each feed, its position among them). Only feeds at
    position 0 are shared (a fresh prompt, nothing cached before it: the same tokens give the same K/V); a
    feed further on, after a row's own transcript, is its own."""
    first: dict[tuple[int, ...], int] = {}
    run, position = [], []
    for j, (_, start, tokens) in enumerate(feeds):
        key = tuple(tokens) if start == 0 else None
        if key is None or key not in first:
            if key is not None:
                first[key] = len(run)
            position.append(len(run))
            run.append(j)
        else:
            position.append(first[key])
    return run, position


@contextmanager
def rows_of(cache: KVCache, index: torch.Tensor, whole: bool) -> Iterator[KVCache]:
    """Rows `index` of `cache` to write into: the cache itself when they are all of it, else a copy of them that is
    written back at the end of the block."""
    sub = cache if whole else cache.select(index)
    yield sub
    if not whole:
        cache.assign(index, sub)
