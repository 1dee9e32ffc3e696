"""Draft losses (PAPER §4): closed-form gradients, e2e TV, expected accepted, the tiled TV, errors."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

from bebop.draft_vocab import MIN_CHUNK_ROWS, default_chunk_rows
from bebop.losses import (
    LOG_PROB_FLOOR,
    OBJECTIVES,
    acceptance_alpha,
    draft_loss,
    expected_accepted,
    tv_distance,
)
from bebop.losses_from_hidden import (acceptance_alpha_from_hidden, draft_loss_and_alpha_from_hidden,
                                      draft_loss_from_hidden)
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead, chain_targets
from bebop.models.transformer import Transformer
from bebop.sampling import logprobs_from_logits, scaled_logits
from bebop.tv_tiled import tv_overlap_tiled


def _logits(shape, seed, scale=2.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)


def _pair(shape, seed, noise=1.0):
    """Draft logits near the target's, so TV sits well inside (0, 1)."""
    target = _logits(shape, seed)
    return target + noise * _logits(shape, seed + 1, scale=1.0), target


def _grad_at(objective, index, temperature=1.0, mask=None, labels=None, shape=(2, 3, 2, 11)):
    draft, target = _pair(shape, seed=7)
    draft.requires_grad_(True)
    loss = draft_loss(draft, target, objective=objective, labels=labels, mask=mask, temperature=temperature)
    loss.backward()
    return draft.detach(), target, draft.grad[index]


# ---------------------------------------------------------------- closed-form gradients (PAPER §4)

@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("objective", ["ce", "kl", "rkl", "tv"])
def test_gradient_matches_closed_form(objective, temperature):
    shape = (2, 3, 2, 11)
    index = (1, 2, 1)  # one (b, t, k)
    labels = torch.randint(0, shape[-1], shape[:-1], generator=torch.Generator().manual_seed(3))
    draft, target, grad = _grad_at(objective, index, temperature, labels=labels, shape=shape)
    z, t = draft[index] / temperature, target[index] / temperature
    q, p = torch.softmax(z, -1), torch.softmax(t, -1)  # [V]
    if objective == "ce":
        closed = q - torch.nn.functional.one_hot(labels[index], shape[-1]).float()
    elif objective == "kl":
        closed = q - p
    elif objective == "rkl":
        log_ratio = torch.log(q / p)
        closed = q * (log_ratio - (q * log_ratio).sum())
    else:
        below = (q <= p).float()
        closed = -q * (below - (q * below).sum())
    # The loss averages over B·T anchors and γ steps; the logits are divided by T.
    scale = 1.0 / (shape[0] * shape[1] * shape[2] * temperature)
    torch.testing.assert_close(grad, closed * scale, rtol=1e-4, atol=1e-7)


def test_loss_values_match_definitions():
    draft, target = _pair((2, 2, 3, 9), seed=11)
    q, p = torch.softmax(draft, -1), torch.softmax(target, -1)
    labels = torch.randint(0, 9, (2, 2, 3), generator=torch.Generator().manual_seed(0))
    expect = {
        "ce": -torch.log(q.gather(-1, labels[..., None])).mean(),
        "kl": (p * torch.log(p / q)).sum(-1).mean(),
        "rkl": (q * torch.log(q / p)).sum(-1).mean(),
        "tv": tv_distance(p, q).mean(),
    }
    for objective, value in expect.items():
        got = draft_loss(draft, target, objective=objective, labels=labels)
        torch.testing.assert_close(got, value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_losses_see_the_distributions_the_engine_samples(temperature):
    """Every loss takes q and p from bebop.sampling, the engine's function, at any T and after top-k (the target's
    filtered tokens come in as -inf logits: top-k keeps the same tokens at every T)."""
    draft, target = _pair((2, 3, 2, 29), seed=5)
    filtered = torch.where(torch.isfinite(scaled_logits(target, 1.0, top_k=6)), target, -torch.inf)  # [2, 3, 2, 29]
    logq = logprobs_from_logits(draft, temperature)  # [2, 3, 2, 29]
    logp = logprobs_from_logits(target, temperature, top_k=6)  # [2, 3, 2, 29]
    q, p = logq.exp(), logp.exp()
    labels = torch.randint(0, 29, (2, 3, 2), generator=torch.Generator().manual_seed(1))
    expect = {
        "ce": -logq.gather(-1, labels[..., None]).mean(),
        "kl": (p * (logp.clamp(min=LOG_PROB_FLOOR) - logq)).sum(-1).mean(),
        "rkl": (q * (logq - logp.clamp(min=LOG_PROB_FLOOR))).sum(-1).mean(),
        "tv": tv_distance(p, q).mean(),
    }
    for objective, value in expect.items():
        got = draft_loss(draft, filtered, objective=objective, labels=labels, temperature=temperature)
        torch.testing.assert_close(got, value, rtol=1e-6, atol=2e-7)
    alpha = acceptance_alpha(draft, filtered, temperature)  # [2, 3, 2]
    torch.testing.assert_close(alpha, 1 - tv_distance(p, q), rtol=0, atol=2e-6)


# ---------------------------------------------------------------- e2e TV and expected accepted

def _e2e_naive(draft, target, mask, temperature):
    """Loop-wise 1 - (1/γ) Σ_j Π_{i≤j} α_i averaged over valid anchors, plain softmax + |p - q|."""
    batch, anchors, gamma, _ = draft.shape
    total, count = 0.0, 0
    for b in range(batch):
        for t in range(anchors):
            if not mask[b, t]:
                continue
            survive, accepted = 1.0, 0.0
            for k in range(gamma):
                p = torch.softmax(target[b, t, k] / temperature, -1)
                q = torch.softmax(draft[b, t, k] / temperature, -1)
                survive = survive * (1.0 - 0.5 * (p - q).abs().sum())
                accepted = accepted + survive
            total, count = total + (1.0 - accepted / gamma), count + 1
    return total / count


@pytest.mark.parametrize("temperature", [1.0, 1.3])
def test_e2e_tv_matches_naive_reference(temperature):
    draft, target = _pair((2, 4, 3, 13), seed=21)
    mask = torch.tensor([[True, True, False, True], [True, False, True, True]])
    mine = draft.clone().requires_grad_(True)
    ref = draft.clone().requires_grad_(True)
    loss = draft_loss(mine, target, objective="e2e_tv", mask=mask, temperature=temperature)
    expect = _e2e_naive(ref, target, mask, temperature)
    loss.backward()
    expect.backward()
    torch.testing.assert_close(loss, expect, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mine.grad, ref.grad, rtol=1e-4, atol=1e-7)


def test_e2e_tv_weights_early_steps_more():
    # Same per-step TV error at step 1 or at step γ: the e2e loss must punish the early one more.
    alpha_early = torch.tensor([0.5, 1.0, 1.0])
    alpha_late = torch.tensor([1.0, 1.0, 0.5])
    assert expected_accepted(alpha_early) < expected_accepted(alpha_late)


def _brute_force_expected(alpha):
    """Σ_l l·P(L = l) by enumerating every accept/reject outcome of the γ steps."""
    gamma = len(alpha)
    expect = 0.0
    for outcome in itertools.product([0, 1], repeat=gamma):
        prob = 1.0
        for a, ok in zip(alpha, outcome):
            prob *= a if ok else 1.0 - a
        accept_length = next((i for i, ok in enumerate(outcome) if not ok), gamma)
        expect += accept_length * prob
    return expect


def test_expected_accepted_matches_enumeration():
    g = torch.Generator().manual_seed(5)
    alpha = torch.rand(4, 6, 5, generator=g, dtype=torch.float64)  # [..., γ]
    alpha[0, 0] = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0], dtype=torch.float64)  # hard cases
    got = expected_accepted(alpha)
    assert got.shape == (4, 6)
    for i, j in itertools.product(range(4), range(6)):
        assert got[i, j].item() == pytest.approx(_brute_force_expected(alpha[i, j].tolist()), abs=1e-12)
    assert got[0, 0].item() == pytest.approx(2.0)


def test_acceptance_alpha_is_one_minus_tv():
    draft, target = _pair((2, 3, 2, 17), seed=31)
    alpha = acceptance_alpha(draft, target, temperature=0.8)
    expect = 1.0 - tv_distance(torch.softmax(target / 0.8, -1), torch.softmax(draft / 0.8, -1))
    assert alpha.shape == (2, 3, 2)
    torch.testing.assert_close(alpha, expect, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- tiled TV == plain TV

def _plain_overlap(draft, target, temperature):
    p = torch.softmax(target.detach().float() / temperature, -1)
    q = torch.softmax(draft.float() / temperature, -1)
    return 1.0 - tv_distance(p, q)


@pytest.mark.parametrize(
    "vocab,tile,row_block,temperature",
    [(1, 8192, None, 1.0), (7, 3, 2, 1.0), (100, 64, 3, 0.5), (257, 1, 4, 1.7), (8195, 8192, None, 1.0),
     (20000, 999, 5, 0.9)],
)
def test_tiled_equals_plain(vocab, tile, row_block, temperature):
    draft, target = _pair((3, 2, vocab), seed=vocab)
    weights = torch.linspace(-1.0, 2.0, 6).reshape(3, 2)  # a non-uniform upstream gradient
    tiled_in, plain_in = draft.clone().requires_grad_(True), draft.clone().requires_grad_(True)
    tiled = tv_overlap_tiled(tiled_in, target, temperature, tile, row_block=row_block)
    plain = _plain_overlap(plain_in, target, temperature)
    (tiled * weights).sum().backward()
    (plain * weights).sum().backward()
    assert tiled.shape == (3, 2) and tiled.dtype == torch.float32
    torch.testing.assert_close(tiled, plain, rtol=0, atol=2e-6)
    torch.testing.assert_close(tiled_in.grad, plain_in.grad, rtol=1e-4, atol=1e-7)


def test_tiled_exact_ties_give_overlap_one_and_zero_gradient():
    target = _logits((4, 300), seed=1)
    draft = target.clone().requires_grad_(True)  # p == q bit for bit
    overlap = tv_overlap_tiled(draft, target, 1.0, 64)
    overlap.sum().backward()
    plain_in = target.clone().requires_grad_(True)
    _plain_overlap(plain_in, target, 1.0).sum().backward()
    torch.testing.assert_close(overlap, torch.ones(4), rtol=0, atol=1e-6)
    torch.testing.assert_close(draft.grad, torch.zeros_like(draft), rtol=0, atol=1e-7)
    torch.testing.assert_close(draft.grad, plain_in.grad, rtol=0, atol=1e-7)


def test_tiled_handles_exact_zeros_in_target():
    draft, target = _pair((3, 50), seed=4)
    target[:, ::3] = -torch.inf  # p = 0 on a third of the vocabulary (as after top-k)
    target[1, :40] = -torch.inf  # and a whole tile of -inf in one row
    tiled_in, plain_in = draft.clone().requires_grad_(True), draft.clone().requires_grad_(True)
    tiled = tv_overlap_tiled(tiled_in, target, 1.0, 8)
    plain = _plain_overlap(plain_in, target, 1.0)
    tiled.sum().backward()
    plain.sum().backward()
    assert torch.isfinite(tiled).all() and torch.isfinite(tiled_in.grad).all()
    torch.testing.assert_close(tiled, plain, rtol=0, atol=2e-6)
    torch.testing.assert_close(tiled_in.grad, plain_in.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_tiled_leaves_its_inputs_unchanged(temperature):
    # At T = 1 a float32 tile of scaled logits is a view of the input: the kernel must never write into it.
    draft, target = _pair((3, 40), seed=6)
    tiled_in, target_in = draft.clone().requires_grad_(True), target.clone()
    tv_overlap_tiled(tiled_in, target_in, temperature, 8).sum().backward()
    assert torch.equal(tiled_in.detach(), draft) and torch.equal(target_in, target)


def test_tiled_bf16_inputs_compute_in_float32():
    draft, target = _pair((4, 3, 5000), seed=9)
    draft_bf, target_bf = draft.bfloat16().requires_grad_(True), target.bfloat16()
    tiled = tv_overlap_tiled(draft_bf, target_bf, 1.0, 1024)
    tiled.sum().backward()
    # Same bf16 values upcast exactly: float32-close to the plain fp32 computation on them.
    upcast = draft_bf.detach().float().requires_grad_(True)
    plain = _plain_overlap(upcast, target_bf.float(), 1.0)
    plain.sum().backward()
    assert tiled.dtype == torch.float32 and draft_bf.grad.dtype == torch.bfloat16
    torch.testing.assert_close(tiled, plain, rtol=0, atol=2e-6)
    torch.testing.assert_close(draft_bf.grad.float(), upcast.grad, rtol=1e-2, atol=1e-6)
    # And within bf16 rounding of the original fp32 inputs.
    torch.testing.assert_close(tiled, _plain_overlap(draft, target, 1.0), rtol=0, atol=2e-2)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_draft_loss_on_bf16_computes_in_float32(objective):
    draft, target = _pair((2, 3, 2, 300), seed=12)
    labels = torch.randint(0, 300, (2, 3, 2), generator=torch.Generator().manual_seed(2))
    draft_bf, target_bf = draft.bfloat16(), target.bfloat16()
    low = draft_loss(draft_bf, target_bf, objective=objective, labels=labels, temperature=0.7)
    exact = draft_loss(draft_bf.float(), target_bf.float(), objective=objective, labels=labels, temperature=0.7)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, exact, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- target gets no gradient, mask, zeros

@pytest.mark.parametrize("objective", OBJECTIVES)
def test_target_gets_no_gradient(objective):
    draft, target = _pair((2, 2, 3, 10), seed=2)
    draft.requires_grad_(True)
    target.requires_grad_(True)
    labels = torch.zeros(2, 2, 3, dtype=torch.long)
    draft_loss(draft, target, objective=objective, labels=labels).backward()
    assert target.grad is None
    assert draft.grad is not None and draft.grad.abs().sum() > 0


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_masked_anchors_do_not_count(objective):
    draft, target = _pair((2, 3, 2, 12), seed=13)
    labels = torch.randint(0, 12, (2, 3, 2), generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[True, False, True], [False, True, True]])
    garbage = (~mask)[..., None, None]
    other_draft = torch.where(garbage, 50.0 * _logits(draft.shape, 99), draft).requires_grad_(True)
    other_target = torch.where(garbage, -50.0 * _logits(draft.shape, 98), target)
    other_labels = torch.where(~mask[..., None], torch.full_like(labels, -100), labels)  # padding
    draft.requires_grad_(True)
    loss = draft_loss(draft, target, objective=objective, labels=labels, mask=mask)
    other = draft_loss(other_draft, other_target, objective=objective, labels=other_labels, mask=mask)
    loss.backward()
    other.backward()
    torch.testing.assert_close(loss, other, rtol=1e-6, atol=1e-7)
    assert (other_draft.grad[~mask] == 0).all() and (draft.grad[~mask] == 0).all()
    torch.testing.assert_close(draft.grad[mask], other_draft.grad[mask])
    # The same as the loss over the valid anchors alone, as a batch of one.
    alone = draft_loss(draft.detach()[mask][None], target[mask][None], objective=objective, labels=labels[mask][None])
    torch.testing.assert_close(loss, alone, rtol=1e-5, atol=1e-7)


def test_reverse_kl_with_zero_target_probability_is_large_but_finite():
    draft, target = _pair((1, 1, 2, 6), seed=17)
    target[..., 0] = -torch.inf  # p = 0 where q > 0
    draft.requires_grad_(True)
    rkl = draft_loss(draft, target, objective="rkl")
    rkl.backward()
    assert torch.isfinite(rkl) and torch.isfinite(draft.grad).all()
    q0 = torch.softmax(draft.detach(), -1)[..., 0].mean()
    assert rkl.item() > -LOG_PROB_FLOOR * q0.item() * 0.9  # the clamp's cost shows up
    kl = draft_loss(draft.detach(), target, objective="kl")
    assert torch.isfinite(kl)


# ---------------------------------------------------------------- errors

def test_clear_errors():
    draft, target = _pair((2, 3, 2, 5), seed=0)
    labels = torch.zeros(2, 3, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="unknown objective 'mse'.*ce, kl, rkl, tv, e2e_tv"):
        draft_loss(draft, target, objective="mse")
    with pytest.raises(ValueError, match=r"\(2, 3, 2, 5\).*\(2, 3, 2, 6\)"):
        draft_loss(draft, _logits((2, 3, 2, 6), 0), objective="tv")
    with pytest.raises(ValueError, match=r"\[B, T, γ, V\]"):
        draft_loss(draft[0], target[0], objective="kl")
    with pytest.raises(ValueError, match="needs labels"):
        draft_loss(draft, target, objective="ce")
    with pytest.raises(ValueError, match="labels must have shape"):
        draft_loss(draft, target, objective="ce", labels=labels[..., :1])
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        draft_loss(draft, target, objective="ce", labels=labels + 5)
    with pytest.raises(ValueError, match="integer"):
        draft_loss(draft, target, objective="ce", labels=labels.float())
    with pytest.raises(ValueError, match="mask must have shape"):
        draft_loss(draft, target, objective="tv", mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        draft_loss(draft, target, objective="tv", mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="no valid anchor"):
        draft_loss(draft, target, objective="tv", mask=torch.zeros(2, 3, dtype=torch.bool))
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            draft_loss(draft, target, objective="kl", temperature=bad)
    with pytest.raises(ValueError, match="target_probs shape"):
        tv_distance(torch.ones(3), torch.ones(4))
    with pytest.raises(ValueError, match="tile"):
        tv_overlap_tiled(draft, target, 1.0, 0)
    with pytest.raises(ValueError, match="scalar"):
        expected_accepted(torch.tensor(0.5))


# ---------------------------------------------------------------- `bebop bench losses`, tiny

@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="CPU peak RSS needs Linux /proc")
# ------------------------------------------------------------------------------------ the hidden-state path
def _hidden_case(seed, batch=2, anchors=6, depth=3, dim=8, vocab=37):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, dim, generator=g)  # [V, d]
    draft_hidden = torch.randn(batch, anchors, depth, dim, generator=g).requires_grad_(True)  # [B, T, γ, d]
    target_hidden = torch.randn(batch, anchors, depth, dim, generator=g)  # [B, T, γ, d]
    mask = torch.rand(batch, anchors, generator=g) > 0.3  # [B, T]
    mask[0, 0] = True
    labels = torch.randint(0, vocab, (batch, anchors, depth), generator=g)  # [B, T, γ]
    labels[~mask] = -100  # padding at masked anchors, as callers pass it
    return draft_hidden, target_hidden, weight, mask, labels


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_loss_from_hidden_equals_dense_loss_and_gradient(objective, temperature):
    draft_hidden, target_hidden, weight, mask, labels = _hidden_case(seed=3)
    dense = draft_loss(draft_hidden @ weight.T, target_hidden @ weight.T, objective=objective, labels=labels,
                       mask=mask, temperature=temperature)
    (dense_grad,) = torch.autograd.grad(dense, draft_hidden)
    rows = int(mask.sum()) * draft_hidden.shape[2]
    assert rows % 7 != 0  # chunks of 7 rows split the rows unevenly
    chunked = draft_loss_from_hidden(draft_hidden, target_hidden, weight, objective=objective, labels=labels,
                                     mask=mask, temperature=temperature, chunk_rows=7)
    (chunked_grad,) = torch.autograd.grad(chunked, draft_hidden)
    torch.testing.assert_close(chunked, dense, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(chunked_grad, dense_grad, rtol=1e-4, atol=1e-7)
    assert dense_grad.abs().max() > 0 and bool((chunked_grad[~mask] == 0).all())


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_loss_from_hidden_trains_a_head_like_the_dense_loss(objective):
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=41, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    model, head = Transformer(config).eval().requires_grad_(False), MTPHead(config)
    tokens = torch.randint(0, 41, (2, 12))
    lengths, depth = torch.tensor([12, 9]), 3
    logits, hidden = model(tokens)  # [B, T, V], [B, T, d]
    grads = []
    for dense in (True, False):
        head.zero_grad(set_to_none=True)
        if dense:
            target, labels, mask = chain_targets(logits, tokens, depth, lengths)
            loss = draft_loss(head.chain(model, hidden, tokens, depth), target, objective=objective, labels=labels,
                              mask=mask, temperature=0.8)
        else:
            target_hidden, labels, mask = chain_targets(hidden, tokens, depth, lengths)  # [B, T, γ, d]
            loss = draft_loss_from_hidden(head.chain_hidden(model, hidden, tokens, depth), target_hidden,
                                          model.lm_head.weight, objective=objective, labels=labels, mask=mask,
                                          temperature=0.8, chunk_rows=4)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in head.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_acceptance_alpha_from_hidden_is_alpha_at_valid_anchors():
    draft_hidden, target_hidden, weight, mask, _ = _hidden_case(seed=5)
    with torch.no_grad():
        dense = acceptance_alpha(draft_hidden @ weight.T, target_hidden @ weight.T, 0.9)[mask]  # [M, γ]
        chunked = acceptance_alpha_from_hidden(draft_hidden, target_hidden, weight, mask=mask, temperature=0.9,
                                               chunk_rows=7)
    torch.testing.assert_close(chunked, dense)


# glibc maps every block over its largest mmap threshold (32 MiB on 64-bit) from the kernel and unmaps it on free
GLIBC_MMAP_THRESHOLD_MAX = 32 << 20


@pytest.mark.parametrize("width", [8192, 49152])  # SmolLM2's draft vocabulary and its whole vocabulary
def test_default_chunks_stay_in_the_heap_and_keep_enough_rows(width):
    """A chunk's float32 [rows, width] block stays under glibc's mmap threshold, so its pages are reused from the
    heap instead of being mapped and faulted in afresh for every chunk (docs/real-model.md); over a whole vocabulary
    a chunk keeps MIN_CHUNK_ROWS rows for its read of the weight."""
    rows = default_chunk_rows(width)
    assert rows >= MIN_CHUNK_ROWS
    assert rows * width * 4 < GLIBC_MMAP_THRESHOLD_MAX


def test_the_default_chunks_give_the_values_of_any_other():
    draft_hidden, target_hidden, weight, mask, labels = _hidden_case(seed=11)
    with torch.no_grad():
        chunked = acceptance_alpha_from_hidden(draft_hidden, target_hidden, weight, mask=mask, temperature=0.9)
        by_row = acceptance_alpha_from_hidden(draft_hidden, target_hidden, weight, mask=mask, temperature=0.9,
                                              chunk_rows=1)
    torch.testing.assert_close(chunked, by_row)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_loss_and_alpha_in_one_pass_equal_the_two_passes(objective):
    """What a training step optimises and logs, from one trip through the LM head: the same loss, gradient and α."""
    draft_hidden, target_hidden, weight, mask, labels = _hidden_case(seed=7)
    kwargs = dict(objective=objective, labels=labels, mask=mask, temperature=0.8, chunk_rows=7)
    loss, alpha = draft_loss_and_alpha_from_hidden(draft_hidden, target_hidden, weight, **kwargs)  # [], [M, γ]
    (grad,) = torch.autograd.grad(loss, draft_hidden)
    alone = draft_loss_from_hidden(draft_hidden, target_hidden, weight, **kwargs)
    (alone_grad,) = torch.autograd.grad(alone, draft_hidden)
    with torch.no_grad():
        alpha_alone = acceptance_alpha_from_hidden(draft_hidden, target_hidden, weight, mask=mask, temperature=0.8,
                                                   chunk_rows=7)  # [M, γ]
    torch.testing.assert_close(loss, alone, rtol=0, atol=0)
    torch.testing.assert_close(grad, alone_grad, rtol=0, atol=0)
    torch.testing.assert_close(alpha, alpha_alone, rtol=0, atol=0)
    assert alpha.shape == (int(mask.sum()), draft_hidden.shape[2]) and not alpha.requires_grad


@pytest.mark.parametrize("change, match", [
    ({"weight": torch.zeros(37, 9)}, "lm_head_weight must be"),
    ({"target_hidden": torch.zeros(2, 6, 2, 8)}, "target_hidden shape"),
    ({"mask": torch.zeros(2, 6, dtype=torch.bool)}, "no valid anchor"),
    ({"chunk_rows": 0}, "chunk_rows"),
    ({"labels": None}, "needs labels"),
])
def test_loss_from_hidden_rejects_bad_input(change, match):
    draft_hidden, target_hidden, weight, mask, labels = _hidden_case(seed=1)
    args = {"target_hidden": target_hidden, "weight": weight, "mask": mask, "labels": labels, "chunk_rows": None,
            **change}
    with pytest.raises(ValueError, match=match):
        draft_loss_from_hidden(draft_hidden, args["target_hidden"], args["weight"], objective="ce",
                               labels=args["labels"], mask=args["mask"], chunk_rows=args["chunk_rows"])
