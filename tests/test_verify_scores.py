"""bebop.verify.verify_scores, the engine's verification: from scores and log-normalisers, q kept over the draft
vocabulary, each row to its own depth. Exact by enumeration (its two pieces, per depth, q over S or one-hot), the
pieces the same as `verify`'s, its draws the ones those pieces make, and a chi-square check of its own draws."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

import bebop.verify as verify_module
from bebop.sampling import sample
from bebop.verify import (Drafts, acceptance_from_logp, acceptance_probs, residual_from_probs, residual_probs, verify,
                          verify_scores)

VOCAB, GAMMA = 6, 3


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _dirichlet(shape, gen) -> torch.Tensor:
    weights = -torch.rand(shape, generator=gen, dtype=torch.float64).log()
    return weights / weights.sum(-1, keepdim=True)


def _case(name: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """target [γ+1, V], draft q [γ, K] over S and S's ids [K] (None: S = V) for a case."""
    gen = _gen(seed)
    target = _dirichlet((GAMMA + 1, VOCAB), gen)
    if name == "draft_vocab":  # S leaves out p's favourite token at the first position
        favourite = int(target[0].argmax())
        ids = torch.tensor(sorted(t for t in torch.randperm(VOCAB, generator=gen)[:4].tolist() if t != favourite))
        return target, _dirichlet((GAMMA, ids.numel()), gen), ids
    draft = _dirichlet((GAMMA, VOCAB), gen)
    if name == "disjoint":
        target[:, VOCAB // 2:], draft[:, :VOCAB // 2] = 0, 0
    elif name == "close":
        draft = target[:GAMMA] * (1 + 2e-3 * torch.rand(GAMMA, VOCAB, generator=gen, dtype=torch.float64))
    elif name == "zeros":
        draft[:, ::2], target[:, 1::3] = 0, 0
    return target / target.sum(-1, keepdim=True), draft / draft.sum(-1, keepdim=True), None


def _full(draft: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    """q over S spread over V."""
    return draft if ids is None else torch.zeros(*draft.shape[:-1], VOCAB, dtype=draft.dtype).index_copy(-1, ids, draft)


def _scores(target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores with the target's law (log p shifted by a constant per position, as logits are) and their LSE."""
    scores = target.log() + torch.arange(target.shape[0], dtype=target.dtype)[:, None]
    return scores, scores.logsumexp(-1)


def _exact_law(target, draft, ids, depth: int, one_hot: bool) -> torch.Tensor:
    """Exact law [V]*(depth+1) of the first depth+1 emitted tokens (completed with draws from p past the step), from
    `acceptance_from_logp` and `residual_from_probs`: every draft sequence (q's, or the greedy one when one_hot)."""
    full = _full(draft, ids)
    logp = target.log()
    if one_hot:
        sequences, weights = [tuple(full.argmax(-1)[:depth].tolist())], [1.0]
    else:
        sequences = list(itertools.product(range(VOCAB), repeat=depth))
        weights = [float(torch.prod(torch.stack([full[i, t] for i, t in enumerate(s)]))) if s else 1.0
                   for s in sequences]
    law = torch.zeros([VOCAB] * (depth + 1), dtype=torch.float64)
    for seq, weight in zip(sequences, weights):
        if weight == 0:
            continue
        tokens = torch.tensor(seq, dtype=torch.long)  # [d]
        hat = torch.ones(depth, dtype=torch.float64) if one_hot else full[torch.arange(depth), tokens]
        alpha = acceptance_from_logp(logp[torch.arange(depth), tokens], hat)  # [d]
        reach = 1.0
        for k in range(depth + 1):  # exactly k accepted, then recovered (k < d) or bonus
            if k < depth:
                residual = residual_from_probs(target[k], draft[k], ids, tokens[k], torch.tensor(one_hot))
                nxt, stop = residual / residual.sum(), reach * (1 - float(alpha[k]))
            else:
                nxt, stop = target[depth], reach
            joint = torch.zeros(VOCAB ** (k + 1), dtype=torch.float64)
            base = sum(int(t) * VOCAB ** (k - 1 - i) for i, t in enumerate(seq[:k]))
            joint[base * VOCAB: base * VOCAB + VOCAB] = weight * stop * nxt
            for j in range(k + 1, depth + 1):
                joint = torch.outer(joint, target[j]).flatten()
            law += joint.reshape(law.shape)
            if k < depth:
                reach *= float(alpha[k])
    return law


def _product(target: torch.Tensor, depth: int) -> torch.Tensor:
    law = target[0]
    for row in target[1:depth + 1]:
        law = torch.outer(law.flatten(), row).flatten()
    return law.reshape([VOCAB] * (depth + 1))


@pytest.mark.parametrize("case", ["random", "disjoint", "close", "zeros", "draft_vocab"])
@pytest.mark.parametrize("one_hot", [False, True], ids=["q", "one_hot"])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_each_depth_emits_exactly_the_target_law(case, one_hot, depth):
    for seed in range(3):
        target, draft, ids = _case(case, seed)
        law = _exact_law(target, draft, ids, depth, one_hot)
        torch.testing.assert_close(law, _product(target, depth), atol=1e-9, rtol=0)


def test_the_enumeration_catches_a_residual_that_forgets_q(monkeypatch):
    target, draft, ids = _case("random", 0)
    real = verify_module.residual_from_probs
    monkeypatch.setattr(verify_module, "residual_from_probs", lambda probs, *args: real(probs, None, None, args[2],
                                                                                      torch.tensor(False)))
    law = _exact_law_patched(target, draft, ids)
    assert 0.5 * (law - _product(target, 2)).abs().sum() > 0.02


def _exact_law_patched(target, draft, ids):
    # _exact_law reads the pieces through this module's names; route it through the patched module's.
    global residual_from_probs
    saved, residual_from_probs = residual_from_probs, verify_module.residual_from_probs
    try:
        return _exact_law(target, draft, ids, 2, False)
    finally:
        residual_from_probs = saved


@pytest.mark.parametrize("case", ["random", "close", "zeros", "draft_vocab"])
def test_the_pieces_are_verifys_pieces(case):
    target, draft, ids = _case(case, 1)
    full = _full(draft, ids)
    gen = _gen(2)
    tokens = sample(full.expand(50, -1, -1), gen)  # [50, γ]
    batch_target, batch_full = target.expand(50, -1, -1), full.expand(50, -1, -1)
    logp_hat = target.log()[torch.arange(GAMMA), tokens]  # [50, γ]
    torch.testing.assert_close(acceptance_from_logp(logp_hat, full[torch.arange(GAMMA), tokens]),
                               acceptance_probs(tokens, batch_target, batch_full, "rs"))
    for one_hot, method in ((False, "rs"), (True, "to")):
        flags = torch.full((50, GAMMA), one_hot)
        residual = residual_from_probs(target[:GAMMA].expand(50, -1, -1), draft.expand(50, -1, -1), ids, tokens,
                                      flags)
        torch.testing.assert_close(residual / residual.sum(-1, keepdim=True),
                                   residual_probs(tokens, batch_target, batch_full, method))


def _drafts(target, draft, ids, rows: int, depths: torch.Tensor, one_hot: torch.Tensor, gen) -> Drafts:
    full = _full(draft, ids)
    sampled = sample(draft.expand(rows, -1, -1), gen)  # [R, γ] indices into S
    greedy = draft.argmax(-1).expand(rows, -1)
    index = torch.where(one_hot[:, None], greedy, sampled)
    tokens = index if ids is None else ids[index]
    hat = torch.where(one_hot[:, None], 1.0, full[torch.arange(GAMMA), tokens])
    return Drafts(tokens, hat, depths, one_hot, draft.expand(rows, -1, -1), ids)


def test_rectangular_verify_scores_draws_what_verify_draws():
    # The same uniforms, q over S and full depths: the same accepted counts and tokens as `verify` with q spread.
    target, draft, ids = _case("draft_vocab", 3)
    rows, gen = 400, _gen(4)
    one_hot = torch.arange(rows) % 3 == 0
    drafts = _drafts(target, draft, ids, rows, torch.full((rows,), GAMMA), one_hot, gen)
    uniforms = torch.rand(rows, GAMMA + 1, dtype=torch.float64, generator=gen)
    scores, lse = _scores(target)
    index = torch.arange(GAMMA + 1).expand(rows, -1)
    got = verify_scores(scores, lse, index, drafts, uniforms)
    q = torch.where(one_hot[:, None, None], torch.nn.functional.one_hot(drafts.tokens, VOCAB).double(),
                    _full(draft, ids).expand(rows, -1, -1))
    want = verify(drafts.tokens, target.expand(rows, -1, -1), q, uniforms=uniforms)
    assert torch.equal(got.num_accepted, want.num_accepted) and torch.equal(got.next_token, want.next_token)


def test_ragged_depths_stop_where_each_row_asks_and_draw_its_bonus_there():
    target, draft, ids = _case("random", 5)
    rows, gen = 300, _gen(6)
    depths = torch.arange(rows) % (GAMMA + 1)
    drafts = _drafts(target, draft, ids, rows, depths, torch.zeros(rows, dtype=torch.bool), gen)
    uniforms = torch.rand(rows, GAMMA + 1, dtype=torch.float64, generator=gen)
    scores, lse = _scores(target)
    # Packed scores: each row's positions 0..depth are rows of `scores`; index maps them (past the depth: anything).
    index = torch.arange(GAMMA + 1).expand(rows, -1).minimum(depths[:, None])
    verdict = verify_scores(scores, lse, index, drafts, uniforms)
    assert (verdict.num_accepted <= depths).all()
    alpha = acceptance_from_logp(target.log()[torch.arange(GAMMA), drafts.tokens], drafts.draft_hat)  # [R, γ]
    for b in range(rows):
        d, n = int(depths[b]), int(verdict.num_accepted[b])
        want = 0
        while want < d and uniforms[b, want] < alpha[b, want]:
            want += 1
        assert n == want
        law = target[n] if n == d else residual_from_probs(target[n], draft[n], ids, drafts.tokens[b, n],
                                                          torch.tensor(False))
        assert int(verdict.next_token[b]) == int(sample(law, uniform=uniforms[b, GAMMA]))


def test_ragged_first_two_tokens_pass_chi_square():
    # Rows of depths 0, 1 and 2 (a quarter one-hot) draw their first two tokens from p_1 x p_2.
    target, draft, ids = _case("draft_vocab", 7)
    rows, gen = 60_000, _gen(8)
    depths = torch.arange(rows) % 3
    drafts = _drafts(target, draft, ids, rows, depths, torch.arange(rows) % 4 == 0, gen)
    uniforms = torch.rand(rows, GAMMA + 1, dtype=torch.float64, generator=gen)
    scores, lse = _scores(target)
    verdict = verify_scores(scores, lse, torch.arange(GAMMA + 1).expand(rows, -1), drafts, uniforms)
    n, nxt = verdict.num_accepted, verdict.next_token
    first = torch.where(n >= 1, drafts.tokens[:, 0], nxt)
    second = torch.where(n >= 2, drafts.tokens[:, 1], torch.where(n == 1, nxt, sample(target[1].expand(rows, -1), gen)))
    counts = torch.bincount(first * VOCAB + second, minlength=VOCAB ** 2).double()
    law = torch.outer(target[0], target[1]).flatten()
    assert chisquare(counts.numpy(), (law * rows).numpy()).pvalue > 1e-3
    wrong = torch.outer(target[1], target[1]).flatten()
    assert chisquare(counts.numpy(), (wrong * rows).numpy()).pvalue < 1e-6


def test_greedy_is_prefix_matching_per_depth():
    gen = _gen(9)
    target = _dirichlet((GAMMA + 1, VOCAB), gen)
    best = target.argmax(-1)
    tokens = torch.stack([best[:GAMMA], best[:GAMMA], torch.tensor([best[0], (best[1] + 1) % VOCAB, best[2]])])
    depths = torch.tensor([3, 1, 3])
    drafts = Drafts(tokens, torch.ones(3, GAMMA, dtype=torch.float64), depths, torch.ones(3, dtype=torch.bool))
    scores, lse = _scores(target)
    verdict = verify_scores(scores, lse, torch.arange(GAMMA + 1).expand(3, -1), drafts,
                            torch.zeros(3, GAMMA + 1, dtype=torch.float64), "greedy")
    assert verdict.num_accepted.tolist() == [3, 1, 1]
    assert verdict.next_token.tolist() == [int(best[3]), int(best[1]), int(best[1])]
