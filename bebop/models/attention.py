"""Rotary embeddings and the attention paths of `bebop.models.transformer`, as pure functions on tensors.

  * `causal_attend`: a plain causal forward over [B, S] (training); SDPA, whose CPU kernel skips the masked half
    and was faster than explicit matmuls at pretraining shapes.
  * `prefix_attend`: rows that continue a shared prompt attend over its keys/values, computed once per prompt
    (the GRPO update: every completion of a group starts with the same prompt), through `masked_attend`.
  * `masked_attend`: attention under an additive bias (0 visible, -inf hidden). SDPA, except in bf16 on a CPU
    with native bf16 (`bebop.device.cpu_has_fast_bf16`): there `grouped_attend`'s batched matmuls measured faster
    forward and backward than SDPA's masked CPU kernel at the GRPO update's shapes (32 rows of 160 queries over 200
    keys) and smaller ones (docs/benchmarks.md), while in fp32 SDPA was as fast or faster. The MTP chain's
    attention (bebop.models.mtp) stays on SDPA: the grouped form measured no faster there.
  * `cached_attend` with `cached_attention_setup`: row b's new tokens sit at positions cache.lengths[b] + s
    (RoPE positions too); their K/V are written there and query s attends to slots <= lengths[b] + s, over
    the first `kv_len` slots only. Plain matmul attention with queries grouped as [B, Hkv, G*S, D], so K/V are
    never repeated per head (in fp32 on CPU, where that is faster than bf16 at these sizes). No host sync;
    `cache.lengths` is left alone (see bebop/models/kvcache.py).

The cache write indexes the all-layer buffer [L, B, Hkv, max_len, D] itself, not a per-layer view of it: under
`torch.compile` a write through a view is functionalised into a copy of the whole buffer per layer and step (a
compiled step got slower than an eager one, and slower as the cache grew), while a write into the graph input is
done in place.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

from bebop.device import cpu_has_fast_bf16
from bebop.models.kvcache import KVCache

if TYPE_CHECKING:
    from bebop.models.config import ModelConfig

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (q, k, v) -> out [B, H, S, D]


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """RoPE's rotation speed per pair of dimensions [D/2] in fp32: theta^(-2i/D), rescaled for Llama 3.1
    (`llama3_scaled_frequencies`) when the config asks for it."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))  # [D/2]
    if config.rope_scaling is None:
        return inv_freq
    s = config.rope_scaling
    return llama3_scaled_frequencies(inv_freq, s.factor, s.low_freq_factor, s.high_freq_factor,
                                     s.original_max_position_embeddings)


def llama3_scaled_frequencies(inv_freq: torch.Tensor, factor: float, low_freq_factor: float,
                              high_freq_factor: float, original_max_position_embeddings: int) -> torch.Tensor:
    """Llama 3.1's frequency scaling, inv_freq [D/2] -> [D/2]. With wavelength w = 2π / f and the pretraining
    context L = original_max_position_embeddings:

        w < L / high_freq_factor  ->  f                     (fast rotations resolve positions locally: kept)
        w > L / low_freq_factor   ->  f / factor            (slow rotations are stretched to the longer context)
        otherwise                 ->  (1 - s) f / factor + s f,   s = (L / w - low_freq_factor)
                                                                      / (high_freq_factor - low_freq_factor)

    s runs from 0 at the long-wavelength edge to 1 at the short one, so the three pieces join continuously."""
    wavelength = 2 * math.pi / inv_freq  # [D/2]
    L = original_max_position_embeddings
    stretched = torch.where(wavelength > L / low_freq_factor, inv_freq / factor, inv_freq)  # [D/2]
    smooth = (L / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)  # [D/2]
    blended = (1 - smooth) * stretched / factor + smooth * stretched  # [D/2]
    between = (wavelength >= L / high_freq_factor) & (wavelength <= L / low_freq_factor)  # [D/2]
    return torch.where(between, blended, stretched)


def rope_tables(config: ModelConfig, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin [max_position_embeddings, head_dim] in fp32, from the angles of transformers' RoPE
    (default, or llama3-scaled: `rope_inverse_frequencies`). The sin table carries rotate-half's sign ([-sin, sin]
    over the two halves), so `apply_rope` is a roll and one multiply-add: x*cos + rotate_half(x)*sin exactly
    (negation is exact), up to the rounding of a fused multiply-add."""
    dim = config.head_dim
    inv_freq = rope_inverse_frequencies(config).to(device)  # [D/2]
    freqs = torch.arange(config.max_position_embeddings, device=device).float()[:, None] * inv_freq  # [P, D/2]
    angles = torch.cat([freqs, freqs], -1)  # [P, D]
    sign = torch.cat([-torch.ones(dim // 2, device=device), torch.ones(dim // 2, device=device)])  # [D]
    return angles.cos(), angles.sin() * sign


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, S, D] by cos / signed sin (see `rope_tables`) broadcastable to it ([S, D] or [B, 1, S, D])."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin_signed)


def causal_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain causal attention, q [B, H, S, D], k/v [B, Hkv, S, D] -> [B, H, S, D]."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


def additive_bias(visible: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A bool mask (True = visible) as the additive bias attention adds to its scores: 0 or -inf."""
    zero = torch.zeros((), dtype=dtype, device=visible.device)
    return torch.where(visible, zero, zero - math.inf)


def grouped_attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """q [B, H, S, D] over keys/values [B, Hkv, T, D] plus `bias` broadcastable to [B, Hkv, G, S, T] -> [B, H, S, D].

    Query head h reads kv head h // G (G = H / Hkv): grouping the G heads of a kv head into the row dimension
    lets one batched matmul serve them without copying K/V per head. The softmax runs in fp32."""
    B, H, S, D = q.shape
    Hkv, T = keys.shape[1], keys.shape[2]
    assert H % Hkv == 0 and values.shape == keys.shape, (q.shape, keys.shape, values.shape)
    grouped = (q * (1.0 / math.sqrt(D))).reshape(B, Hkv, -1, D)  # [B, Hkv, G*S, D]
    scores = (grouped @ keys.transpose(-1, -2)).view(B, Hkv, -1, S, T) + bias  # [B, Hkv, G, S, T]
    probs = torch.softmax(scores, -1, dtype=torch.float32).to(values.dtype)
    return (probs.view(B, Hkv, -1, T) @ values).view(B, H, S, D)


# Above this many attention scores, grouped_attend's materialised scores (kept for the backward) would cost more
# memory than they save time: 256 MB in fp32.
GROUPED_MAX_SCORES = 2**26


def masked_attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """q [B, H, S, D] over keys/values [B, Hkv, T, D] under an additive bias [B or 1, 1, S, T] -> [B, H, S, D]."""
    small = q.shape[:3].numel() * keys.shape[2] <= GROUPED_MAX_SCORES
    # The grouped form won only where oneDNN has native bf16 matmuls; elsewhere SDPA's own kernel is kept.
    if q.device.type == "cpu" and q.dtype == torch.bfloat16 and small and cpu_has_fast_bf16():
        return grouped_attend(q, keys, values, bias[:, :, None])
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=bias.to(q.dtype),
                                          enable_gqa=q.shape[1] != keys.shape[1])


def prefix_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, prefix_k: torch.Tensor,
                  prefix_v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Suffix queries q [N, H, S, D] over a prefix's keys/values prefix_k/prefix_v [N, Hkv, P, D] (gathered per
    row from a shared prompt) followed by the suffix's own k/v [N, Hkv, S, D]; bias [N, 1, S, P + S] additive."""
    keys, values = torch.cat([prefix_k, k], 2), torch.cat([prefix_v, v], 2)  # [N, Hkv, P + S, D]
    return masked_attend(q, keys, values, bias)


def write_kv(k: torch.Tensor, v: torch.Tensor, *, k_cache: torch.Tensor, v_cache: torch.Tensor, layer: int,
             rows: torch.Tensor, pos: torch.Tensor) -> None:
    """Write k/v [B, Hkv, S, D] into layer `layer` of the caches [L, B, Hkv, max_len, D] at slots pos [B, S] (rows
    [B, 1] is arange(B))."""
    index = (rows.new_full((1, 1), layer), rows, slice(None), pos)  # all advanced but Hkv: an in-place write
    k_cache[index] = k.transpose(1, 2)  # [B, S, Hkv, D] into slots pos
    v_cache[index] = v.transpose(1, 2)


def cached_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, layer: int, rows: torch.Tensor, pos: torch.Tensor,
                  bias: torch.Tensor) -> torch.Tensor:
    """Write k/v [B, Hkv, S, D] into layer `layer` of the caches [L, B, Hkv, max_len, D] at slots pos [B, S] (rows
    [B, 1] is arange(B)), then attend q [B, H, S, D] over the first kv_len slots with additive bias
    [B, 1, 1, S, kv_len]."""
    kv_len = bias.shape[-1]
    write_kv(k, v, k_cache=k_cache, v_cache=v_cache, layer=layer, rows=rows, pos=pos)
    keys, values = k_cache[layer, :, :, :kv_len], v_cache[layer, :, :, :kv_len]  # [B, Hkv, kv_len, D]
    dtype = q.dtype
    if keys.device.type == "cpu" and dtype != torch.float32:
        # On CPU, attention of a few query rows is a chain of tiny batched matmuls: oneDNN's bf16 bmm pays a
        # fixed cost each and repacks the strided cache slice with a slow generic copy, while fp32 BLAS does not.
        # Upcasting is the one copy of the slice anyway: measured faster at batch 1 (docs/benchmarks.md), no
        # slower at 32, and more exact.
        q, keys, values = q.float(), keys.float(), values.float()
    return grouped_attend(q, keys, values, bias).to(dtype)


def cached_attention_setup(cache: KVCache, num_new: int, kv_len: int | None, rope_cos: torch.Tensor,
                           rope_sin_signed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """What every layer of a cached forward shares: RoPE cos/sin [B, 1, S, D] at each row's own positions,
    and the write slots / attention bias for `cached_attend`. Shapes only; no host sync."""
    kv_len = cache.max_len if kv_len is None else kv_len
    if not isinstance(kv_len, int) or not num_new <= kv_len <= cache.max_len:
        raise ValueError(f"kv_len must be an int in [{num_new}, max_len={cache.max_len}] "
                         f"(>= max(lengths) + new tokens), got {kv_len!r}")
    pos = cache.positions(num_new)  # [B, S]
    slots = torch.arange(kv_len, device=cache.device)  # [kv_len]
    visible = slots <= pos[..., None]  # [B, S, kv_len]: slot j is visible to query s iff j <= lengths[b] + s
    bias = additive_bias(visible, cache.dtype)  # [B, S, kv_len]
    rows = torch.arange(cache.batch, device=cache.device)[:, None]  # [B, 1]
    # Only padding slots of a multi-row write can lie past the RoPE table (real positions are bounds-checked
    # by the caller); clamping them keeps the gather in range, and those slots are never attended to.
    rope_pos = pos.clamp(max=rope_cos.shape[0] - 1)
    cos, sin = rope_cos[rope_pos][:, None], rope_sin_signed[rope_pos][:, None]  # [B, 1, S, D]
    return cos, sin, dict(rows=rows, pos=pos, bias=bias[:, None, None])
