"""A verification forward over ragged rows: each row computes its own width (its pending token and its own drafts).

A step's tokens form a rectangle [B, W] (W = the deepest row's depth + 1), but with each row at its own depth only
N = Σ_b widths[b] of them are verified. On a CPU a forward costs about what its tokens cost, so the linear layers,
the LM head and the target's statistics run over the N positions packed in row order (`Layout.flat`), and only
attention sees the rectangle: each layer's queries, keys and values are scattered into it, attended as in the
cached forward (`bebop.models.attention.cached_attend`), and gathered back. The rectangle's other positions are
zeros: their keys and values land in cache slots past their row's width, which no query of the row attends to (row
b's query i sees slots <= lengths[b] + i < lengths[b] + widths[b]) and which stay stale, to be overwritten later, as
a rejected draft's do.

`Layout` also maps every (row, position) of the rectangle to its packed position (`index`), what the verifier and
the host table read through; for a rectangle every row fills (all depths alike) it is the identity and the forward
is the model's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from bebop.engine.transfer import upload
from bebop.models.attention import cached_attend, cached_attention_setup
from bebop.models.kvcache import KVCache


@dataclass(frozen=True)
class Layout:
    """Which positions of a step's [B, W] rectangle are computed, where each lands among them, and which decoder
    layers' residual streams each hands back beside its hidden state (a fused head's taps)."""

    index: torch.Tensor  # [B, W] long: the packed position of row b's position i (past its width: its last one)
    flat: torch.Tensor | None  # [N] long: b·W + i of each packed position, row by row (None: all B·W, in order)
    taps: tuple[int, ...] = ()

    @property
    def width(self) -> int:
        return self.index.shape[1]


def layout_of(widths: list[int], rows: int, device: torch.device, taps: tuple[int, ...] = ()) -> Layout:
    """The layout of a step whose first len(widths) tensor rows compute widths[b] >= 1 positions each and whose
    padding rows (up to `rows`) one each, tapping `taps`. One upload of a host table."""
    widths = [*widths, *[1] * (rows - len(widths))]
    width = max(widths)
    if all(w == width for w in widths):
        return Layout(torch.arange(rows * width, device=device).view(rows, width), None, taps)
    starts = [0]
    for w in widths[:-1]:
        starts.append(starts[-1] + w)
    index = [[s + min(i, w - 1) for i in range(width)] for s, w in zip(starts, widths)]
    flat = [b * width + i for b, w in enumerate(widths) for i in range(w)]
    table = upload([*[i for row in index for i in row], *flat], device)  # one copy up
    return Layout(table[: rows * width].view(rows, width), table[rows * width:], taps)


def ragged_forward(model, tokens: torch.Tensor, layout: Layout, cache: KVCache, kv_len: int) -> torch.Tensor:
    """Hidden states [N, d] (after the final norm) of the packed positions of tokens [B, W], as the model's cached
    forward computes them for those positions (with the layout's taps, a fused head's features [N, (1 + n) d]); the
    cache gets their keys and values, its lengths stay."""
    batch, width, taps = *tokens.shape, layout.taps
    if layout.flat is None:
        _, hidden = model.forward(tokens, cache, kv_len=kv_len, compute_logits=False, taps=taps)  # [B, W, d']
        return hidden.reshape(batch * width, -1)
    cos, sin, shared = cached_attention_setup(cache, width, kv_len, model.rope_cos, model.rope_sin_signed)
    flat = layout.flat  # [N]
    cos, sin = (t.reshape(batch * width, -1)[flat][None, None] for t in (cos, sin))  # [1, 1, N, D]
    attends = [partial(_ragged_attend, flat=flat, batch=batch, width=width, k_cache=cache.k, v_cache=cache.v,
                       layer=i, **shared) for i in range(cache.num_layers)]
    return model.forward_layers(tokens.reshape(-1)[flat][None], cos, sin, attends, taps)[0]  # [N, d']


def _ragged_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, flat: torch.Tensor, batch: int, width: int,
                   **cached) -> torch.Tensor:
    """Attention of packed q [1, H, N, D] (k, v [1, Hkv, N, D]) in the step's rectangle: scattered into [B, H, W, D],
    `cached_attend`, gathered back to [1, H, N, D]."""
    def rectangle(x: torch.Tensor) -> torch.Tensor:  # [1, h, N, D] -> [B, h, W, D], zeros off the packed positions
        heads, dim = x.shape[1], x.shape[3]
        out = x.new_zeros(heads, batch * width, dim).index_copy_(1, flat, x[0])
        return out.view(heads, batch, width, dim).transpose(0, 1)
    out = cached_attend(rectangle(q), rectangle(k), rectangle(v), **cached)  # [B, H, W, D]
    return out.transpose(0, 1).reshape(out.shape[1], batch * width, -1)[:, flat][None]


def rectangle_hidden(hidden: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Packed hidden [N, d] as the step's rectangle [B, W, d] (zeros off the packed positions): the head's catch-up
    reads each row's positions up to what it emitted."""
    batch, width = layout.index.shape
    if layout.flat is None:
        return hidden.view(batch, width, -1)
    out = hidden.new_zeros(batch * width, hidden.shape[-1]).index_copy_(0, layout.flat, hidden)
    return out.view(batch, width, -1)
