"""A draft vocabulary S: choosing and storing it, the losses on S against a full-vocabulary target, and drafting over
it through the engine, exactly lossless (by chi-square, eager and compiled; the law by enumeration is
tests/test_verify.py's "draft_vocab" case)."""

from __future__ import annotations

import pytest
import torch

from bebop.draft_vocab import (check_ids, choose, coverage, from_d2t, log_normaliser, probability_mass, scatter_probs,
                               target_logp, to_d2t, to_t2d)
from bebop.engine import Engine
from bebop.engine.rollout import GenerationConfig
from bebop.losses import OBJECTIVES
from bebop.losses_from_hidden import acceptance_alpha_from_hidden, draft_loss_and_alpha_from_hidden
from bebop.models.checkpoint import load_head, load_pretrained, save_head, save_pretrained
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.selfdraft import self_draft_pair
from bebop.models.transformer import Transformer
from exact_law import check_first_three, first_three_law


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- the vocabulary itself ------------------------------------------------------------------------------------------
def test_choose_ranks_by_mass_forces_required_ids_and_breaks_ties_by_id():
    mass = torch.tensor([0.1, 5.0, 0.2, 3.0, 3.0, 0.0, 0.0, 0.0, 1.0])
    assert choose(mass, 3).tolist() == [1, 3, 4]
    assert choose(mass, 3, required=(8,)).tolist() == [1, 3, 8]  # the tie 3 / 4 goes to the lower id
    assert choose(mass, 2, required=(7, 6)).tolist() == [6, 7]
    with pytest.raises(ValueError, match="do not fit"):
        choose(mass, 1, required=(1, 2))
    with pytest.raises(ValueError, match="size"):
        choose(mass, 10)


def test_d2t_and_t2d_encode_the_ids_as_eagle3_stores_them():
    ids = torch.tensor([2, 3, 7, 40])
    assert to_d2t(ids).tolist() == [2, 2, 5, 37]  # target id = draft index + d2t[index]
    assert torch.equal(from_d2t(to_d2t(ids)), ids)
    assert to_t2d(ids, 64).nonzero()[:, 0].tolist() == ids.tolist()
    for bad, match in [(torch.tensor([3, 3]), "increasing"), (torch.tensor([1, 64]), r"\[0, 64\)"),
                       (torch.tensor([], dtype=torch.long), "non-empty"), (torch.tensor([1.0]), "long")]:
        with pytest.raises(ValueError, match=match):
            check_ids(bad, 64)


def test_one_pass_gives_the_mass_the_log_normaliser_and_exact_probabilities_on_s():
    gen = _gen(0)
    hidden, weight = torch.randn(37, 8, generator=gen), torch.randn(50, 8, generator=gen)
    for temperature in (1.0, 0.7):
        mass, lse = probability_mass(hidden, weight, temperature, chunk_rows=5)
        probs = torch.softmax(hidden @ weight.T / temperature, -1)  # [N, V]
        torch.testing.assert_close(mass, probs.double().sum(0), rtol=1e-5, atol=1e-6)  # float32 softmax rows
        torch.testing.assert_close(lse, log_normaliser(hidden, weight, temperature))
        ids = choose(mass, 12)
        exact = target_logp(hidden, weight[ids], lse, temperature)  # [N, K]
        torch.testing.assert_close(exact.exp(), probs[:, ids])
        torch.testing.assert_close(coverage(exact), probs[:, ids].sum(-1))


def test_scatter_puts_q_on_s_and_zero_elsewhere():
    ids = torch.tensor([1, 4, 6])
    q = torch.softmax(torch.randn(2, 3, 3, generator=_gen(1)), -1)
    full = scatter_probs(q, ids, 8)
    assert full.shape == (2, 3, 8)
    torch.testing.assert_close(full[..., ids], q)
    assert full[..., [0, 2, 3, 5, 7]].abs().max() == 0


# ---- losses on S -----------------------------------------------------------------------------------------------------
def _loss_case(seed: int = 0):
    gen = _gen(seed)
    B, T, depth, d, V = 2, 5, 3, 8, 40
    draft = torch.randn(B, T, depth, d, generator=gen, requires_grad=True)
    target = torch.randn(B, T, depth, d, generator=gen)
    weight = torch.randn(V, d, generator=gen)
    labels = torch.randint(V, (B, T, depth), generator=gen)
    mask = torch.rand(B, T, generator=gen) < 0.7
    mask[0, 0] = True
    ids = torch.randperm(V, generator=gen)[:15].sort().values
    return draft, target, weight, labels, mask, ids


def _brute_force(objective: str, draft, target, weight, labels, mask, ids, temperature):
    """The loss on S written out over the full vocabulary: q zero off S, p the full target."""
    q_s = torch.softmax(draft[mask] @ weight[ids].T / temperature, -1)  # [M, γ, K]
    p = torch.softmax(target[mask] @ weight.T / temperature, -1)  # [M, γ, V]
    q = scatter_probs(q_s, ids, weight.shape[0])
    alpha = torch.minimum(p, q).sum(-1)  # [M, γ]
    if objective == "tv":
        return (1 - alpha).mean(), alpha
    if objective == "e2e_tv":
        return (1 - alpha.cumprod(-1).sum(-1) / alpha.shape[-1]).mean(), alpha
    p_s = p[..., ids]
    if objective == "kl":
        return (p_s * (p_s.log() - q_s.log())).sum(-1).mean(), alpha
    if objective == "rkl":
        return (q_s * (q_s.log() - p_s.log())).sum(-1).mean(), alpha
    y = labels[mask]  # [M, γ]
    inside = torch.isin(y, ids)
    index = torch.searchsorted(ids, y.clamp(max=int(ids[-1])))
    nll = -q_s.log().gather(-1, index[..., None])[..., 0]
    return torch.where(inside, nll, torch.zeros_like(nll)).mean(), alpha  # a token outside S adds 0


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("temperature", [1.0, 0.8])
@pytest.mark.parametrize("cached_lse", [False, True])
def test_losses_on_s_equal_their_full_vocabulary_definition_and_gradient(objective, temperature, cached_lse):
    draft, target, weight, labels, mask, ids = _loss_case()
    lse = log_normaliser(target.reshape(-1, 8), weight, temperature).reshape(target.shape[:3]) if cached_lse else None
    loss, alpha = draft_loss_and_alpha_from_hidden(draft, target, weight, objective=objective, labels=labels,
                                                   mask=mask, temperature=temperature, chunk_rows=7, draft_ids=ids,
                                                   target_lse=lse)
    (grad,) = torch.autograd.grad(loss, draft)
    want_loss, want_alpha = _brute_force(objective, draft, target, weight, labels, mask, ids, temperature)
    (want_grad,) = torch.autograd.grad(want_loss, draft)
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(alpha, want_alpha.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=1e-6)
    p_s = coverage(target_logp(target[mask].reshape(-1, 8), weight[ids], log_normaliser(
        target[mask].reshape(-1, 8), weight, temperature), temperature)).reshape(alpha.shape)
    assert bool((alpha <= p_s + 1e-6).all())  # p(S) caps the acceptance


def test_with_s_the_whole_vocabulary_the_losses_are_the_full_ones():
    draft, target, weight, labels, mask, _ = _loss_case(1)
    ids = torch.arange(weight.shape[0])
    for objective in OBJECTIVES:
        on_s = draft_loss_and_alpha_from_hidden(draft, target, weight, objective=objective, labels=labels, mask=mask,
                                                draft_ids=ids)
        full = draft_loss_and_alpha_from_hidden(draft, target, weight, objective=objective, labels=labels, mask=mask)
        torch.testing.assert_close(on_s[0], full[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(on_s[1], full[1], rtol=1e-5, atol=1e-6)
    alpha = acceptance_alpha_from_hidden(draft, target, weight, mask=mask, draft_ids=ids[:10])
    assert alpha.shape == (int(mask.sum()), 3)


def test_a_cached_log_normaliser_must_fit_and_needs_a_draft_vocabulary():
    draft, target, weight, labels, mask, ids = _loss_case()
    with pytest.raises(ValueError, match="target_lse must be"):
        draft_loss_and_alpha_from_hidden(draft, target, weight, objective="tv", mask=mask, draft_ids=ids,
                                         target_lse=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="pass draft_ids"):
        draft_loss_and_alpha_from_hidden(draft, target, weight, objective="tv", mask=mask,
                                         target_lse=torch.zeros(2, 5, 3))


# ---- the head and its files --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair():
    config = ModelConfig.tiny(vocab_size=64, num_hidden_layers=2)
    torch.manual_seed(0)
    return Transformer(config).eval(), MTPHead(config, trained_depth=3, objective="e2e_tv").eval()


def test_a_head_over_s_drafts_the_lm_heads_rows_of_s(pair):
    model, head = pair
    ids = torch.tensor([0, 5, 9, 33, 63])
    on_s = MTPHead(model.config).eval()
    on_s.load_state_dict(head.state_dict())
    on_s.use_draft_vocab(ids)
    hidden = torch.randn(3, 2, model.config.hidden_size)
    torch.testing.assert_close(on_s.logits(model, hidden), head.logits(model, hidden)[..., ids])
    assert on_s.draft_size == 5 and head.draft_size == 64
    assert on_s.to_target(torch.tensor([0, 4])).tolist() == [0, 63]
    with torch.no_grad():  # an RL update changes the LM head in place: the gathered rows follow
        model.lm_head.weight.mul_(2)
    torch.testing.assert_close(on_s.logits(model, hidden), head.logits(model, hidden)[..., ids])
    with torch.no_grad():
        model.lm_head.weight.div_(2)


def test_save_and_load_keep_the_draft_vocabulary_as_d2t_and_t2d(pair, tmp_path):
    model, head = pair
    ids = torch.tensor([1, 2, 30, 61])
    head.use_draft_vocab(ids)
    try:
        save_head(head, tmp_path / "h")
        loaded = load_head(tmp_path / "h", model.config)
        assert torch.equal(loaded.draft_ids, ids)
        save_pretrained(model, tmp_path / "p", head)
        _, stored = load_pretrained(tmp_path / "p")
        assert torch.equal(stored.draft_ids, ids)
    finally:
        head.use_draft_vocab(None)
    from safetensors.torch import load_file
    tensors = load_file(tmp_path / "h" / "head.safetensors")
    assert torch.equal(tensors["mtp.d2t"], to_d2t(ids)) and torch.equal(tensors["mtp.t2d"], to_t2d(ids, 64))
    tensors["mtp.t2d"][0] = True  # a t2d that disagrees with d2t is refused
    from safetensors.torch import save_file
    save_file(tensors, tmp_path / "h" / "head.safetensors")
    with pytest.raises(ValueError, match="t2d does not mark"):
        load_head(tmp_path / "h", model.config)


# ---- drafting over S through the engine ------------------------------------------------------------------------------
def test_greedy_decoding_with_a_head_over_s_is_plain_greedy_decoding(pair):
    model, head = pair
    prompts = [[1, 2, 3], [4, 5, 6, 7], [8]]
    plain = Engine(model).generate(prompts, GenerationConfig(max_new_tokens=12, temperature=0, gamma=0))
    head.use_draft_vocab(torch.tensor([3, 7, 11, 50]))
    try:
        for method in ("rs", "to", "greedy"):
            spec = Engine(model, head).generate(prompts, GenerationConfig(max_new_tokens=12, temperature=0, gamma=3,
                                                                          method=method))
            assert spec.tokens == plain.tokens, method
    finally:
        head.use_draft_vocab(None)


def _near_pair_over_s(vocab: int = 5):
    """A one-layer policy and a draft near it (accepts, rejections and bonuses all occur), its drafts restricted to an
    S that leaves out the policy's most likely first token after the prompt."""
    config = ModelConfig.tiny(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=32)
    model, head = self_draft_pair(config, seed=3)
    noise = torch.randn(config.hidden_size, config.hidden_size, generator=_gen(1))
    with torch.no_grad():
        head.fc.weight[:, : config.hidden_size].add_(noise * 0.4)
    prompt = [1, 2]
    with torch.no_grad():
        first = int(model(torch.tensor([prompt]))[0][0, -1].argmax())
    ids = torch.tensor([t for t in range(vocab) if t != first][:3])
    return model, head.use_draft_vocab(ids), prompt, first


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rs", "to"])
@pytest.mark.parametrize("sampling", [{}, {"top_k": 4, "top_p": 0.9}])
def test_the_first_three_tokens_through_a_head_over_s_follow_the_target_exactly(method, sampling):
    """Chi-square of 24,000 rows' first three tokens against plain sampling's law (enumerated), at γ = 1 and 2, with
    S missing the target's favourite first token; top-k / top-p filter p and q alike (q over S, where top-k 4 keeps
    all of S's 3 and must not leave a row of -inf). The same counts against a wrong law are rejected."""
    vocab, n = 5, 24_000
    model, head, prompt, first = _near_pair_over_s(vocab)
    assert first not in head.draft_ids.tolist()
    law = first_three_law(model, prompt, vocab, **sampling)
    engine = Engine(model, head)
    for gamma in (1, 2):
        rollout = engine.generate([prompt] * n, GenerationConfig(max_new_tokens=3, gamma=gamma, method=method, seed=7,
                                                                 **sampling))
        drafted = {t for row, origins in zip(rollout.tokens, rollout.origin)
                   for t, o in zip(row, origins) if o == "accepted"}
        assert drafted <= set(head.draft_ids.tolist()), "an accepted draft outside S"
        check_first_three(rollout.tokens, law, vocab)
        assert 0.05 < rollout.stats["spec/acceptance_rate"] < 0.95


def test_a_draft_vocabulary_past_the_sampled_ids_is_refused(pair):
    model, head = pair
    head.use_draft_vocab(torch.tensor([3, 60]))
    try:
        with pytest.raises(ValueError, match="past the 50 ids"):
            Engine(model, head).generate([[1, 2]], GenerationConfig(max_new_tokens=4, gamma=2, vocab_limit=50))
    finally:
        head.use_draft_vocab(None)


def test_writers_for_engines_that_draft_over_the_whole_vocabulary_refuse_a_head_over_s(pair, tmp_path):
    from bebop.models.hf_mtp import save_for_transformers
    from bebop.vllm_plugin.draft import write_draft

    model, head = pair
    save_pretrained(model, tmp_path / "policy")
    head.use_draft_vocab(torch.tensor([1, 2, 3]))
    try:
        with pytest.raises(ValueError, match="draft vocabulary of 3 ids"):
            save_for_transformers(model, head, tmp_path / "hf")
        with pytest.raises(ValueError, match="draft vocabulary of 3 ids"):
            write_draft(tmp_path / "policy", head, tmp_path / "vllm")
    finally:
        head.use_draft_vocab(None)
    assert not (tmp_path / "hf").exists() and not (tmp_path / "vllm").exists()


def test_soft_coverage_is_measured_on_the_half_it_was_not_chosen_on(pair):
    """S_K from one half of the answers, p(S_K) on the other: rising with K to exactly 1 at the whole vocabulary,
    and equal to a direct computation over the held-out positions."""
    from bebop.heads.coverage import soft_coverage, written_hidden

    model, _ = pair
    gen = torch.Generator().manual_seed(3)
    corpus = {"tokens": [torch.randint(64, (n,), generator=gen).tolist() for n in (9, 12, 7, 10)],
              "trainable": [[False] * 3 + [True] * (n - 3) for n in (9, 12, 7, 10)]}
    weight = model.lm_head.weight.detach()
    result = soft_coverage(model, corpus, weight, [4, 16, 64], temperature=0.8, required=(2,))
    assert [c.size for c in result] == [4, 16, 64] and result[-1].mean == pytest.approx(1.0)
    # the held-out (odd) answers: positions 2..n-2 of each, whose next token the policy wrote
    assert result[0].mean < result[1].mean < result[2].mean and result[0].positions == (12 - 3) + (10 - 3)
    fit = torch.cat([torch.softmax(h @ weight.T / 0.8, -1) for h in written_hidden(model, {
        k: v[0::2] for k, v in corpus.items()})])
    held = torch.cat([torch.softmax(h @ weight.T / 0.8, -1) for h in written_hidden(model, {
        k: v[1::2] for k, v in corpus.items()})])
    ids = choose(fit.double().sum(0), 16, (2,))
    assert result[1].mean == pytest.approx(float(held[:, ids].sum(-1).mean()), rel=1e-5)
