"""The engine's static shapes: how many rows a decoding step computes and how many cache slots it reads.

A CUDA graph replays fixed kernels on fixed shapes, so a graph per live batch size and per cache length would
record a new graph nearly every step. `Buckets` rounds both up to a few sizes instead:

  * rows      the live rows are padded up to the smallest bucket >= their count (beyond the largest: a multiple
              of it). A finished row stays in its slot as padding, computing garbage nobody reads, until the live
              count fits a smaller bucket; then the survivors are compacted into it (one copy of their caches).
  * kv_len    the slots a step attends over, and the caches' length, are rounded up to a multiple of `kv_multiple`
              (capped by the cache): slots past a row's length are masked, so reading more of them changes nothing.

Compiled with dynamic shapes, each phase of a step is one graph per guard set, and two guards would double the
graphs for nothing. torch specialises a size of 1, so a one-row bucket would get graphs of its own: the default
buckets start at 2 (a lone row runs beside one row of padding). And a step's attended slots, the slice
[:kv_len] of a cache, are contiguous exactly when kv_len equals the cache's length, which the compiled matmul
guards on: a cache gets one `kv_multiple` more than its rows need, so kv_len stays below its length.

`Buckets.exact()` (rows=(), kv_multiple=1) is the unpadded engine: every finished row is dropped at once, every
shape is the exact one. The padding changes no live row's result (no op mixes rows), which tests/test_engine_buckets
checks on CPU against the exact engine from the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bebop.models.kvcache import KVCache


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class Buckets:
    rows: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128)  # batch sizes a step runs at; () = the live count itself
    kv_multiple: int = 64  # attended slots and cache lengths are multiples of this

    def __post_init__(self) -> None:
        rows = tuple(self.rows)
        if any(not isinstance(r, int) or r < 1 for r in rows) or list(rows) != sorted(set(rows)):
            raise ValueError(f"Buckets rows must be increasing positive ints, got {self.rows!r}")
        if not isinstance(self.kv_multiple, int) or self.kv_multiple < 1:
            raise ValueError(f"Buckets kv_multiple must be a positive int, got {self.kv_multiple!r}")
        object.__setattr__(self, "rows", rows)

    @classmethod
    def exact(cls) -> "Buckets":
        return cls(rows=(), kv_multiple=1)

    @property
    def padded(self) -> bool:
        return bool(self.rows)

    def capacity(self, live: int) -> int:
        """The rows a step computes for `live` live rows."""
        if not self.rows:
            return live
        return next((r for r in self.rows if r >= live), None) or _round_up(live, self.rows[-1])

    def cache_len(self, need: int, limit: int | None = None) -> int:
        """The slots per row a cache gets for rows that need `need`, at most `limit` (the model's positions): one
        `kv_multiple` past `need` rounded up, so `kv_len` of any need up to `need` is less than the cache's length."""
        rounded = _round_up(need, self.kv_multiple) + self.kv_multiple
        return rounded if limit is None else min(rounded, max(limit, need))

    def kv_len(self, need: int, max_len: int) -> int:
        """The slots a step attends over when its rows reach slot `need` - 1, in a cache of `max_len` slots."""
        return min(_round_up(need, self.kv_multiple), max_len)


class CachePool:
    """One KV cache per (owner, rows), kept across steps and generate() calls while its length fits, so a padded
    engine writes into the same buffers every time: a CUDA graph records its inputs' addresses, and these
    buffers are mutated in place by the graphs, which CUDA graphs allow only for inputs marked static
    (`static=True`: torch._dynamo.mark_static_address). A cache handed out again starts empty (lengths 0; stale
    slots are never read). Not for two generations at once: they would share the buffers."""

    def __init__(self, static: bool):
        self.static, self.caches = static, {}

    def get(self, owner: torch.nn.Module, rows: int, max_len: int) -> KVCache:
        cache = self.caches.get((id(owner), rows))
        fresh = owner.new_cache(1, 1)  # what the owner's cache looks like now (dtype, device): cheap
        if cache is None or (cache.max_len, cache.dtype, cache.device) != (max_len, fresh.dtype, fresh.device):
            cache = self.caches[(id(owner), rows)] = owner.new_cache(rows, max_len)
            self.mark(cache)
        cache.lengths.zero_()
        return cache

    def mark(self, cache: KVCache) -> None:
        """Mark a cache's buffers static for CUDA graphs (again after `grow` replaced them)."""
        if self.static:
            for tensor in (cache.k, cache.v, cache.lengths):
                torch._dynamo.mark_static_address(tensor)
