"""A KV cache in which every row of the batch has its own length.

Speculative decoding advances each row by its own accepted count after verification, so the rows of a
batch drift apart. The cache keeps one preallocated buffer per layer and a `lengths` vector on the device:

    k[layer]: [B, Hkv, max_len, D]     v[layer]: same     lengths: [B] long

Row b holds valid entries in slots 0..lengths[b]-1. A cached forward over S new tokens writes them at
slots lengths[b] + s and attends to slots <= lengths[b] + s, but does NOT move `lengths`: the caller
advances each row by what it kept (`advance`, or `lengths += n`). Slots past a row's length are stale
(a rejected draft, a padded prompt position) and are simply overwritten by a later write; a query never
reads them, because attention is masked by position.

Bounds are the caller's job. Checking `lengths + S <= max_len` on the device would force a host sync every
step, so the engine keeps a host copy of each row's length and checks it against `max_len` before each step.
A write past `max_len` is never silent: the scatter raises an index error (CPU) or a device assert (CUDA).

Buffers start at zero rather than uninitialised memory: a masked slot still enters the attention matmul
(its probability is exactly 0), and 0 * NaN from garbage memory would poison the row.
"""

from __future__ import annotations

import torch


class KVCache:
    """Per-layer K/V buffers [B, Hkv, max_len, D] plus a per-row length [B] on the device."""

    def __init__(
        self,
        num_layers: int,
        batch: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        for name, value in (("num_layers", num_layers), ("batch", batch), ("num_kv_heads", num_kv_heads),
                            ("max_len", max_len), ("head_dim", head_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"KVCache {name} must be a positive int, got {value!r}")
        shape = (num_layers, batch, num_kv_heads, max_len, head_dim)
        # One tensor for all layers, so keep() moves a row through every layer in one copy.
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, Hkv, max_len, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, Hkv, max_len, D]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # [B]
        self.max_len = max_len

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    def keep(self, rows: torch.Tensor | list[int], through: int | None = None) -> None:
        """Keep only `rows` (distinct row indices, [B'] long or a host list), in that order: finished rows leave the
        batch. With `through` (the slots any kept row has written) the kept rows move down in place through slot
        `through` - 1: a retirement copies the rows that move and the slots they use, and the buffers become views
        of their first B' rows. Without it the rows are copied whole into new contiguous buffers, every slot: what
        a compiled step needs, whose graphs guard on the buffers' strides (a view would compile them all again)."""
        order = rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)  # host sync (a device tensor)
        if isinstance(rows, torch.Tensor) and rows.dim() != 1 or len(order) > self.batch:
            raise ValueError(f"rows must be at most {self.batch} row indices in a 1-D tensor, got {rows!r}")
        if len(set(order)) != len(order):
            raise ValueError(f"rows must be distinct, got {order}")
        index = torch.tensor(order, dtype=torch.long, device=self.device)
        self.lengths = self.lengths.index_select(0, index)
        if through is None:
            self.k, self.v = self.k.index_select(1, index), self.v.index_select(1, index)
            return
        moved = [i for i, row in enumerate(order) if row != i]
        if moved:
            to, source = torch.tensor(moved, device=self.device), index[moved]
            for buffer in (self.k, self.v):  # [L, B, Hkv, max_len, D]; the right side is gathered before the write
                buffer[:, to, :, :through] = buffer[:, source, :, :through]
        self.k, self.v = self.k[:, : len(order)], self.v[:, : len(order)]

    def select(self, rows: torch.Tensor) -> "KVCache":
        """A new cache holding copies of `rows` ([B'] long): work on a few rows, then `assign` them back."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        sub = object.__new__(KVCache)
        sub.k, sub.v = self.k.index_select(1, rows), self.v.index_select(1, rows)
        sub.lengths, sub.max_len = self.lengths.index_select(0, rows), self.max_len
        return sub

    def assign(self, rows: torch.Tensor, sub: "KVCache") -> None:
        """Write the rows of `sub` (from `select(rows)`) back into rows `rows` of this cache."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        if sub.k.shape[1] != rows.numel() or sub.max_len != self.max_len:
            raise ValueError(f"sub-cache has batch={sub.k.shape[1]}, max_len={sub.max_len}; expected "
                             f"batch={rows.numel()}, max_len={self.max_len}")
        self.k.index_copy_(1, rows, sub.k)
        self.v.index_copy_(1, rows, sub.v)
        self.lengths.index_copy_(0, rows, sub.lengths)

    def copy_rows(self, source: torch.Tensor, rows: torch.Tensor) -> None:
        """Rows `rows` ([N] long) become copies of rows `source` ([N] long), lengths included: a prompt that
        several rows share is prefilled into one of them and copied to the others."""
        self.k.index_copy_(1, rows, self.k.index_select(1, source))
        self.v.index_copy_(1, rows, self.v.index_select(1, source))
        self.lengths.index_copy_(0, rows, self.lengths.index_select(0, source))

    def copy_rows_to(self, rows: torch.Tensor, out: "KVCache") -> None:
        """Write rows `rows` ([out.batch] long) of this cache into `out`'s own buffers (same max_len): a `keep` into
        preallocated buffers, whose addresses stay (what CUDA graphs record)."""
        if rows.numel() != out.batch or out.max_len != self.max_len:
            raise ValueError(f"copy_rows_to: {rows.numel()} rows of max_len {self.max_len} into a cache of "
                             f"batch={out.batch}, max_len={out.max_len}")
        torch.index_select(self.k, 1, rows, out=out.k)
        torch.index_select(self.v, 1, rows, out=out.v)
        torch.index_select(self.lengths, 0, rows, out=out.lengths)

    def grow(self, max_len: int) -> None:
        """Make room for `max_len` slots per row (a no-op if there is room): a padded multi-row write reaches
        max(lengths) + width, past what any single row needs, e.g. when environment replies of different
        lengths are fed to rows at different positions."""
        if max_len <= self.max_len:
            return
        shape = (*self.k.shape[:3], max_len, self.k.shape[4])
        for name in ("k", "v"):
            old = getattr(self, name)
            new = torch.zeros(shape, dtype=old.dtype, device=old.device)
            new[:, :, :, : self.max_len] = old
            setattr(self, name, new)
        self.max_len = max_len

    def advance(self, n: torch.Tensor) -> None:
        """Grow each row by its own count: lengths += n, n [B] long (device; no host sync)."""
        if n.shape != self.lengths.shape:
            raise ValueError(f"advance expects n of shape {tuple(self.lengths.shape)}, got {tuple(n.shape)}")
        self.lengths += n.to(self.lengths.device, torch.long)

    def positions(self, num_new: int) -> torch.Tensor:
        """Absolute positions [B, num_new] of the next `num_new` tokens of each row: lengths[b] + s."""
        return self.lengths[:, None] + torch.arange(num_new, device=self.device)
