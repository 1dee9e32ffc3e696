"""bebop.sampling: logit processing semantics and exact, vectorised sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import bebop.sampling
from bebop.sampling import (draw_by_blocks, draw_by_scan, entropy, logprobs_from_logits, normaliser_and_entropy,
                           probs_from_logits, sample, scaled_logits, scores_normaliser_entropy)

NEG_INF = float("-inf")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _chi2_pvalue(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """Chi-square p-value of 1-D token draws against `probs` [V]; zero-probability cells must stay empty."""
    counts = torch.bincount(tokens.flatten(), minlength=probs.numel()).double()
    support = probs > 0
    assert counts[~support].sum() == 0, "sampled a zero-probability token"
    expected = probs[support].double() / probs[support].double().sum() * counts.sum()
    return chisquare(counts[support].numpy(), expected.numpy()).pvalue


# ---- scaled_logits / logprobs_from_logits / probs_from_logits ------------------------------------------


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature_scales_logits_before_softmax(temperature):
    logits = torch.randn(2, 3, 11, generator=_gen(0), dtype=torch.float64)
    logp = logprobs_from_logits(logits, temperature)
    assert logp.shape == logits.shape and logp.dtype == torch.float32
    torch.testing.assert_close(logp, (logits / temperature).log_softmax(-1).float())
    probs = probs_from_logits(logits, temperature)
    torch.testing.assert_close(probs, logp.exp())


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_one_scaling_function_under_probs_and_logprobs(temperature):
    """x / T in float32, then the filters: probs and log-probs are exactly its softmax and log-softmax."""
    logits = torch.randn(3, 17, generator=_gen(11)).bfloat16()
    scaled = scaled_logits(logits, temperature, top_k=5, top_p=0.95)
    assert scaled.dtype == torch.float32
    want = logits.float() / temperature  # [3, 17] the arithmetic seeded rollouts were drawn with
    kept = torch.isfinite(scaled)
    assert torch.equal(scaled[kept], want[kept]) and 1 <= int(kept.sum(-1).min()) and int(kept.sum(-1).max()) <= 5
    assert torch.equal(probs_from_logits(logits, temperature, 5, 0.95), scaled.softmax(-1))
    assert torch.equal(logprobs_from_logits(logits, temperature, 5, 0.95), scaled.log_softmax(-1))


def test_output_is_float32_for_half_precision_logits():
    logits = torch.randn(4, 9, generator=_gen(1)).bfloat16()
    probs = probs_from_logits(logits, 0.7, top_k=5, top_p=0.9)
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(4))


def test_temperature_zero_is_one_hot_at_first_argmax():
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0], [3.0, 1.0, 3.0, 3.0], [-1.0, -2.0, -3.0, -0.5]])
    logp = logprobs_from_logits(logits, 0.0)
    probs = probs_from_logits(logits, 0.0, top_k=2, top_p=0.1)  # filters cannot change a one-hot
    want = torch.tensor([1, 0, 3])  # ties go to the lowest index
    one_hot = torch.nn.functional.one_hot(want, 4).bool()
    assert torch.equal(probs, one_hot.float())
    assert torch.equal(logp[one_hot], torch.zeros(3)) and torch.isneginf(logp[~one_hot]).all()


def test_top_k_keeps_the_k_largest_renormalised():
    logits = torch.randn(5, 10, generator=_gen(2))
    probs = probs_from_logits(logits, 1.5, top_k=3)
    kept = probs > 0
    assert torch.equal(kept.sum(-1), torch.full((5,), 3))
    assert torch.equal(kept, torch.zeros_like(kept).scatter(-1, logits.topk(3, -1).indices, True))
    want = (logits / 1.5).masked_fill(~kept, NEG_INF).softmax(-1)
    torch.testing.assert_close(probs, want)
    torch.testing.assert_close(probs_from_logits(logits, top_k=10), logits.softmax(-1))
    torch.testing.assert_close(probs_from_logits(logits, top_k=99), logits.softmax(-1))


def test_top_k_keeps_ties_at_the_kth_value():
    probs = probs_from_logits(torch.tensor([1.0, 3.0, 2.0, 2.0, 0.0]), top_k=2)
    assert torch.equal(probs > 0, torch.tensor([False, True, True, True, False]))


def _top_p_reference(probs: list[float], top_p: float) -> set[int]:
    """Smallest most-likely-first prefix whose mass reaches top_p (stable order for ties)."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = set(), 0.0
    for i in order:
        if mass >= top_p:
            break
        kept.add(i)
        mass += probs[i]
    return kept


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.8, 0.95])
def test_top_p_keeps_the_smallest_prefix_reaching_top_p(top_p):
    logits = torch.randn(20, 12, generator=_gen(3), dtype=torch.float64) * 2
    probs = probs_from_logits(logits, 0.8, top_p=top_p)
    full = (logits / 0.8).softmax(-1)
    for row in range(20):
        kept = set(torch.nonzero(probs[row]).flatten().tolist())
        assert kept == _top_p_reference(full[row].tolist(), top_p)
        mask = torch.zeros(12, dtype=torch.bool)
        mask[list(kept)] = True
        torch.testing.assert_close(probs[row], (full[row] * mask / full[row][mask].sum()).float())
    torch.testing.assert_close(probs_from_logits(logits, top_p=1.0), logits.softmax(-1).float())


def test_top_p_applies_after_top_k():
    # softmax([3, 2, 1, 0]) = [0.64, 0.24, 0.09, 0.03]; top-2 renormalised = [0.73, 0.27].
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    assert torch.equal(probs_from_logits(logits, top_p=0.7) > 0, torch.tensor([True, True, False, False]))
    assert torch.equal(probs_from_logits(logits, top_k=2, top_p=0.7) > 0, torch.tensor([True, False, False, False]))


def test_masked_entries_are_exactly_zero_and_rows_normalised():
    logits = torch.randn(64, 50, generator=_gen(4))
    logits[:, 7] = NEG_INF  # a masked vocabulary slot stays masked
    logp = logprobs_from_logits(logits, 0.9, top_k=20, top_p=0.9)
    probs = probs_from_logits(logits, 0.9, top_k=20, top_p=0.9)
    assert torch.equal(probs == 0, torch.isneginf(logp))
    assert (probs[:, 7] == 0).all() and ((probs > 0).sum(-1) <= 20).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(64))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": "1"}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.2}, "top_p"),
        ({"vocab_limit": 0}, "vocab_limit"),
        ({"vocab_limit": 2.0}, "vocab_limit"),
    ],
)
def test_bad_processing_arguments_raise(kwargs, match):
    for fn in (logprobs_from_logits, probs_from_logits):
        with pytest.raises(ValueError, match=match):
            fn(torch.zeros(3), **kwargs)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, None, None), (0.7, 2, 0.9), (0.0, None, None)])
def test_vocab_limit_masks_the_padding_ids_first(temperature, top_k, top_p):
    logits = torch.tensor([[0.0, 1.0, 2.0, 50.0, 60.0]])  # ids 3, 4 are padding rows with huge logits
    before = logits.clone()
    probs = probs_from_logits(logits, temperature, top_k, top_p, vocab_limit=3)
    assert torch.equal(logits, before)  # never in place
    assert probs[0, 3:].eq(0).all()
    expected = probs_from_logits(logits[:, :3], temperature, top_k, top_p)  # the same as a 3-id vocabulary
    torch.testing.assert_close(probs[:, :3], expected)
    logp = logprobs_from_logits(logits, temperature, top_k, top_p, vocab_limit=3)
    assert logp[0, 3:].eq(NEG_INF).all()
    assert probs_from_logits(logits, vocab_limit=5).argmax() == 4  # a limit at V masks nothing


def test_bad_logits_raise():
    with pytest.raises(ValueError, match="logits"):
        logprobs_from_logits(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="logits"):
        probs_from_logits(torch.zeros(2, 0))
    with pytest.raises(ValueError, match="logits"):
        probs_from_logits([0.0, 1.0])


# ---- sample -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("processing", [{}, {"temperature": 0.7}, {"temperature": 0}, {"top_k": 5},
                                        {"temperature": 0.8, "top_p": 0.9}, {"vocab_limit": 90}])
def test_the_scores_by_blocks_are_the_whole_tensor_s_bit_for_bit(monkeypatch, dtype, processing):
    """`scores_normaliser_entropy` computes a block of positions at a time (two rows here, 7 rows: a short last
    block) what `scaled_logits` then `normaliser_and_entropy` compute over the whole tensor, every bit of it."""
    vocab = 100
    monkeypatch.setattr(bebop.sampling, "BLOCK_BYTES", 2 * 4 * vocab)
    monkeypatch.setattr(bebop.sampling, "WHOLE_BLOCKS", 1)
    logits = (torch.randn(7, vocab, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    scores, log_normaliser, entropies = scores_normaliser_entropy(logits, **processing)
    whole = scaled_logits(logits, **processing)
    masked = processing.get("temperature") == 0 or len(processing.keys() - {"temperature"}) > 0
    want_normaliser, want_entropies = normaliser_and_entropy(whole, masked)
    assert torch.equal(scores, whole)
    assert torch.equal(log_normaliser, want_normaliser) and torch.equal(entropies, want_entropies)
    with pytest.raises(ValueError, match=r"logits must be \[N, V\]"):
        scores_normaliser_entropy(logits[None])


@pytest.mark.parametrize("shape", [(7,), (5, 7), (2, 3, 7), (0, 7)])
def test_sample_shapes(shape):
    probs = torch.rand(shape, generator=_gen(5)) + 0.01
    tokens = sample(probs, _gen(6))
    assert tokens.shape == shape[:-1] and tokens.dtype == torch.long
    assert ((tokens >= 0) & (tokens < 7)).all()


def test_sample_is_exact_chi_square():
    probs = torch.tensor([0.3, 0.0, 0.05, 0.25, 0.0, 0.001, 0.399])
    tokens = sample(probs.expand(200_000, 7), _gen(7))
    assert _chi2_pvalue(tokens, probs) > 1e-3
    # The same draws must fail against a slightly wrong law: the test has power.
    wrong = torch.tensor([0.31, 0.0, 0.04, 0.25, 0.0, 0.001, 0.399])
    assert _chi2_pvalue(tokens, wrong) < 1e-3


def test_sample_handles_unnormalised_rows_independently():
    weights = torch.tensor([[2.0, 0.0, 6.0], [0.0, 5.0, 0.0], [1e-30, 0.0, 3e-30]], dtype=torch.float64)
    tokens = sample(weights.repeat(40_000, 1, 1), _gen(8))  # [40000, 3]
    assert (tokens[:, 1] == 1).all()
    for row in (0, 2):
        assert _chi2_pvalue(tokens[:, row], weights[row]) > 1e-3


def test_sample_never_returns_a_zero_probability_token():
    # Sparse rows, zeros at both ends (where inverse-CDF rounding would land) and a dominant token.
    gen = _gen(9)
    probs = torch.rand(20_000, 64, generator=gen)
    probs[torch.rand(20_000, 64, generator=gen) < 0.9] = 0.0
    probs[:, 0] = probs[:, -1] = 0.0
    probs[:, 31] += 1e-3
    probs[::2, 17] = 1e6
    tokens = sample(probs, gen)
    assert (probs.gather(-1, tokens[:, None]) > 0).all()


def test_sample_seeded_determinism():
    probs = torch.rand(1000, 30, generator=_gen(10))
    assert torch.equal(sample(probs, _gen(11)), sample(probs, _gen(11)))
    assert not torch.equal(sample(probs, _gen(11)), sample(probs, _gen(12)))


def test_given_uniforms_invert_the_cdf_and_are_what_the_generator_draws():
    # Exact binary weights, so each uniform's token is known: token 1 has no mass and no CDF step.
    weights = torch.tensor([0.25, 0.0, 0.5, 0.25], dtype=torch.float64).expand(6, 4)
    uniform = torch.tensor([0.0, 0.2499, 0.25, 0.7499, 0.75, 0.9999], dtype=torch.float64)
    assert sample(weights, uniform=uniform).tolist() == [0, 0, 2, 2, 3, 3]
    probs = torch.rand(500, 3, 30, generator=_gen(13))
    drawn = torch.rand(500, 3, dtype=torch.float64, generator=_gen(14))
    assert torch.equal(sample(probs, uniform=drawn), sample(probs, _gen(14)))
    with pytest.raises(ValueError, match="uniform must have shape \\(500, 3\\)"):
        sample(probs, uniform=drawn[:, :2])


def _sparse_rows(rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Weights with nine in ten tokens at zero, whole blocks of 8 at zero, zeros at both ends and a dominant token."""
    weights = torch.rand(rows, vocab, generator=generator)
    weights[torch.rand(rows, vocab, generator=generator) < 0.9] = 0.0
    weights[:, 8:40] = 0.0
    weights[:, 0] = weights[:, -1] = 0.0
    weights[:, 61] += 1e-3
    weights[::2, 17] = 1e6
    return weights


@pytest.mark.parametrize("vocab", [1000, 1003])  # blocks of 8 that end the row, or a short last block padded
def test_the_draw_by_blocks_inverts_the_cdf_the_scan_inverts(vocab):
    """For the same uniforms, `draw_by_blocks` returns the scan's token (both are the first token whose cumulative
    weight exceeds u times the total; their float64 sums differ by rounding only), never a token without weight,
    also at the known boundaries of exactly representable weights laid across blocks."""
    gen = _gen(21)
    weights = torch.cat([_sparse_rows(2000, vocab, gen), torch.rand(2000, vocab, generator=gen)])
    u = torch.rand(4000, 1, dtype=torch.float64, generator=gen)
    blocks = draw_by_blocks(weights, u, block=8)
    assert torch.equal(blocks, draw_by_scan(weights, u))
    assert (weights.gather(-1, blocks) > 0).all()
    exact = torch.zeros(6, vocab, dtype=torch.float64)
    exact[:, 3], exact[:, 9], exact[:, 30], exact[:, vocab - 2] = 0.25, 0.25, 0.25, 0.25  # blocks 0, 1, 3 and the last
    edges = torch.tensor([[0.0], [0.2499], [0.25], [0.5], [0.75], [0.9999]], dtype=torch.float64)
    assert draw_by_blocks(exact, edges, block=8)[:, 0].tolist() == [3, 3, 9, 30, vocab - 2, vocab - 2]


def test_sample_over_a_large_vocabulary_draws_by_blocks_and_exactly(monkeypatch):
    """`sample` takes the blocks on a CPU from 8 blocks a row: chi-square against the law, with the power to reject
    a slightly wrong one, and the generator's draws are the given uniforms' (seeded runs reproduce)."""
    monkeypatch.setattr(bebop.sampling, "DRAW_BLOCK", 16)
    probs = torch.zeros(160)
    probs[[2, 17, 18, 47, 100, 159]] = torch.tensor([0.3, 0.05, 0.25, 0.001, 0.199, 0.2])
    tokens = sample(probs.expand(200_000, 160), _gen(22))
    assert _chi2_pvalue(tokens, probs) > 1e-3
    wrong = probs.clone()
    wrong[2], wrong[17] = 0.31, 0.04
    assert _chi2_pvalue(tokens, wrong) < 1e-3
    scattered = torch.rand(300, 160, generator=_gen(23))
    drawn = torch.rand(300, dtype=torch.float64, generator=_gen(24))
    assert torch.equal(sample(scattered, uniform=drawn), sample(scattered, _gen(24)))
    assert torch.equal(sample(scattered, uniform=drawn), draw_by_blocks(scattered, drawn[:, None], block=16)[:, 0])


def test_sample_bad_input_raises():
    with pytest.raises(ValueError, match="probs"):
        sample(torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match="probs"):
        sample(torch.ones(3, 0))
    with pytest.raises(ValueError, match="probs"):
        sample(np.ones(3))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA to check for host syncs")
def test_sample_does_not_sync_on_cuda():
    probs = probs_from_logits(torch.randn(64, 1000, device="cuda"), 0.8, top_k=50, top_p=0.9)
    gen = torch.Generator(device="cuda").manual_seed(0)
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens = sample(probs, gen)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert (probs.gather(-1, tokens[:, None]) > 0).all()


# ---- vocab_limit in the engine and the RL log-probs ------------------------------------------------------


@pytest.fixture(scope="module")
def padded_world(tmp_path_factory):
    """A BPE tokenizer and a steered model with 15 padding rows whose logits beat every real token."""
    from real_tokenizer import chain, make_bpe_tokenizer, steered_pair

    from bebop.data.tokenizer import load_tokenizer

    tok = load_tokenizer(make_bpe_tokenizer(tmp_path_factory.mktemp("bpe")))
    start = tok.encode("\n")[-1]
    transitions = chain(start, tok.encode("ABCDEFG"), tok.eos_id)
    model, head = steered_pair(tok.vocab_size + 15, transitions, padding_from=tok.vocab_size)
    return tok, model, head, start


@pytest.mark.parametrize("gamma, method", [(0, "rs"), (2, "rs"), (2, "to")])
def test_the_engine_never_samples_padding_ids_under_a_vocab_limit(padded_world, gamma, method):
    from bebop.engine import Engine, GenerationConfig

    tok, model, head, start = padded_world
    config = GenerationConfig(max_new_tokens=12, gamma=gamma, method=method, stop_tokens=(tok.eos_id,), seed=0)
    unmasked = Engine(model, head).generate([[start]] * 4, config)
    assert any(t >= tok.vocab_size for row in unmasked.tokens for t in row)  # the padding rows do win unmasked
    masked = Engine(model, head).generate([[start]] * 4, GenerationConfig(**{**config.to_dict(),
                                                                           "vocab_limit": tok.vocab_size}))
    for row in masked.tokens:
        assert row == tok.encode("ABCDEFG") + [tok.eos_id]
        assert [tok.token_str(t) for t in row]  # token_str no longer meets an id outside the vocabulary


def test_collect_masks_padding_and_the_rl_logprobs_match(padded_world):
    from bebop.data import tasks
    from bebop.engine import Engine, GenerationConfig
    from bebop.rl.batch import Rollouts
    from bebop.rl.grpo import token_logprobs

    tok, model, head, _ = padded_world
    task = tasks.get("math")
    batch = Rollouts(Engine(model, head), task, tok).collect(task.sample(3, seed=0),
                                                             GenerationConfig(max_new_tokens=8, gamma=2, seed=0))
    assert all(t < tok.vocab_size for row in batch.rollout.tokens for t in row)
    pieces = [tok.token_str(t) for row in batch.rollout.tokens for t in row]  # the samples display's call
    assert len(pieces) == batch.rollout.num_tokens
    with torch.no_grad():
        logits = model(batch.tokens[:, :-1])[0]  # [N, L-1, V]
    mask = batch.policy_mask
    limited = token_logprobs(logits, batch.targets, vocab_limit=tok.vocab_size)  # [N, L-1]
    torch.testing.assert_close(limited[mask], batch.behaviour_logprobs[mask], atol=1e-4, rtol=1e-4)
    unlimited = token_logprobs(logits, batch.targets)
    assert (unlimited[mask] - batch.behaviour_logprobs[mask]).abs().max() > 1.0  # the mask is what makes them match


def test_the_update_measures_entropy_over_the_real_ids(padded_world, tmp_path):
    """Rollouts without entropies (`full_logprobs` False: VLLMEngine on a large vocabulary) make the update measure
    actor/entropy itself: the policy's entropy over the real ids, as the engine measured it, with the masked padding
    ids adding nothing (0 log 0 = 0, not NaN)."""
    import copy

    from bebop.data import tasks
    from bebop.rl import RLConfig, build_trainer

    tok, model, _, _ = padded_world
    # T = 10 flattens the steered model (about 5.6 nats), so the value is compared, not only its being a number.
    trainer = build_trainer(RLConfig.tiny(method="none", lr=0.0, temperature=10.0), copy.deepcopy(model), tok,
                            run_dir=tmp_path / "u", task=tasks.get("math"))
    assert trainer.vocab_limit == tok.vocab_size < model.config.vocab_size
    batch = trainer._generate(0, 0)
    measured = [h for row in batch.rollout.entropy for h in row]  # math is single-turn: every token is the policy's
    trainer.rollouts.backend.full_logprobs = False
    updated = trainer.update(batch).metrics["actor/entropy"]
    trainer.writer.close()
    assert sum(measured) / len(measured) > 1.0
    assert updated == pytest.approx(sum(measured) / len(measured), abs=5e-2)


def test_entropy_values():
    assert entropy(torch.full((7,), 1 / 7)).item() == pytest.approx(math.log(7))
    one_hot = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert entropy(one_hot).tolist() == [0.0, 0.0]
    p = torch.tensor([0.5, 0.0, 0.25, 0.25])  # zeros contribute nothing
    assert entropy(p).item() == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
    probs = torch.softmax(torch.randn(2, 5, 9, generator=torch.Generator().manual_seed(1)), -1)
    assert torch.allclose(entropy(probs.transpose(1, 2), dim=1), entropy(probs))  # [2, 5] either way
    with pytest.raises(ValueError, match="probs"):
        entropy(torch.tensor([1, 0]))
