"""bebop.models.attention's masked attention: the grouped-matmul path (CPU bf16) and SDPA give the same outputs and gradients
as attention written out in float64, with grouped query heads, and the dispatch picks each where it should."""

from __future__ import annotations

import math

import pytest
import torch

import bebop.models.attention as attention
from bebop.models.attention import additive_bias, grouped_attend, masked_attend


def reference(q, keys, values, visible):
    """Attention spelt out in float64, K/V repeated per query head: q [B, H, S, D], keys/values [B, Hkv, T, D]."""
    groups = q.shape[1] // keys.shape[1]
    k, v = (x.double().repeat_interleave(groups, 1) for x in (keys, values))  # [B, H, T, D]
    scores = q.double() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, H, S, T]
    scores = scores.masked_fill(~visible, -math.inf)
    return torch.softmax(scores, -1) @ v


def inputs(seed=0, B=3, H=4, Hkv=2, S=5, T=7, D=8):
    g = torch.Generator().manual_seed(seed)
    q, keys, values = (torch.randn(B, n, L, D, generator=g, requires_grad=True) for n, L in ((H, S), (Hkv, T), (Hkv, T)))
    visible = torch.rand(B, 1, S, T, generator=g) < 0.6
    visible[..., 0] = True  # every query sees at least one key
    return q, keys, values, visible


def _check_against_reference(attend, dtype, atol):
    q, keys, values, visible = inputs()
    q, keys, values = (x.detach().to(dtype).requires_grad_() for x in (q, keys, values))
    out = attend(q, keys, values, additive_bias(visible))
    want = reference(q, keys, values, visible)
    torch.testing.assert_close(out.double(), want, atol=atol, rtol=0)
    grad = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got_grads = torch.autograd.grad(out, (q, keys, values), grad.to(dtype))
    want_grads = torch.autograd.grad(want, (q, keys, values), grad)
    for got, expected in zip(got_grads, want_grads):
        torch.testing.assert_close(got.double(), expected.double(), atol=atol, rtol=0)


def test_grouped_attend_matches_attention_written_out():
    _check_against_reference(lambda q, k, v, bias: grouped_attend(q, k, v, bias[:, :, None]), torch.float32, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # SDPA, then the grouped matmuls (CPU bf16)
def test_masked_attend_matches_attention_written_out(dtype):
    _check_against_reference(masked_attend, dtype, 1e-5 if dtype == torch.float32 else 5e-2)


def test_grouped_attend_serves_each_query_head_from_its_kv_head():
    """Query head h must read kv head h // G: swapping the two kv heads must change exactly heads 2-3's output."""
    q, keys, values, visible = inputs(seed=1)
    bias = additive_bias(visible)[:, :, None]
    out = grouped_attend(q, keys, values, bias)
    swapped = grouped_attend(q, keys.flip(1), values.flip(1), bias)
    torch.testing.assert_close(out[:, :2], grouped_attend(q[:, :2], keys[:, :1], values[:, :1], bias))
    assert not torch.allclose(out[:, 2:], swapped[:, 2:])


def test_masked_attend_dispatch(monkeypatch):
    """CPU bf16 within GROUPED_MAX_SCORES on a CPU with native bf16: the grouped matmuls, no SDPA call; fp32, past
    the limit, or a CPU that emulates bf16: SDPA."""
    monkeypatch.setattr(attention, "cpu_has_fast_bf16", lambda: True)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    q, keys, values, visible = inputs()
    bias = additive_bias(visible)
    low = [x.detach().bfloat16() for x in (q, keys, values)]
    masked_attend(*low, bias)
    assert calls == []
    masked_attend(q, keys, values, bias)
    assert calls == [1]
    monkeypatch.setattr(attention, "GROUPED_MAX_SCORES", q.shape[:3].numel() * keys.shape[2] - 1)
    masked_attend(*low, bias)
    assert calls == [1, 1]
    monkeypatch.undo()
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    monkeypatch.setattr(attention, "cpu_has_fast_bf16", lambda: False)
    masked_attend(*low, bias)
    assert calls == [1, 1, 1]


def test_additive_bias():
    visible = torch.tensor([[True, False], [False, True]])
    bias = additive_bias(visible, torch.bfloat16)
    assert bias.dtype == torch.bfloat16 and bias[0, 0] == 0 and bias[0, 1] == -math.inf
