"""bebop.verify: exactness by enumeration, statistical checks, greedy reduction, determinism, errors.

Exactness setup: fixed per-position target distributions p_1..p_{γ+1} (context-independent). A verification
step emits num_accepted + 1 tokens; completing the missing tail with draws from the remaining p_j must
give exactly the product law Π_j p_j, whatever the draft q.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from scipy.stats import chisquare

import bebop.verify as verify_module
from bebop.sampling import probs_from_logits, sample
from bebop.verify import Verdict, acceptance_probs, residual_probs, verify

CASES = ("random", "disjoint", "identical", "close", "nearly_identical", "one_hot_p", "one_hot_q", "q_zeros",
         "draft_vocab")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _dirichlet(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    weights = -torch.rand(shape, generator=gen, dtype=torch.float64).log()
    return weights / weights.sum(-1, keepdim=True)


def _one_hot(rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    index = torch.randint(vocab, (rows,), generator=gen)
    return torch.nn.functional.one_hot(index, vocab).double()


def _case(name: str, gamma: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """target [γ+1, V] and draft [γ, V] distributions for an (adversarial) case."""
    gen = _gen(seed)
    target, draft = _dirichlet((gamma + 1, vocab), gen), _dirichlet((gamma, vocab), gen)
    half = vocab // 2
    if name == "disjoint":
        target[:, half:], draft[:, :half] = 0, 0
    elif name == "close":  # d_TV ~ 1e-3: a real residual that must not be mistaken for rounding noise
        draft = target[:gamma] * (1 + 2e-3 * torch.rand(gamma, vocab, generator=gen, dtype=torch.float64))
    elif name in ("identical", "nearly_identical"):
        draft = target[:gamma].clone()
        if name == "nearly_identical":  # p and q differ by float32 rounding-sized amounts
            draft[:, 0] += 1e-7
            draft[:, 1] -= 1e-7
    elif name == "one_hot_p":
        target = _one_hot(gamma + 1, vocab, gen)
    elif name == "one_hot_q":
        draft = _one_hot(gamma, vocab, gen)
    elif name == "q_zeros":
        draft[:, ::2] = 0  # q misses tokens where p > 0 ...
        target[:, 1::3] = 0  # ... and p misses some that q proposes
    elif name == "draft_vocab":  # q over a draft vocabulary S (bebop.draft_vocab) that leaves out p's favourite
        favourite = int(target[0].argmax())
        others = torch.tensor([t for t in torch.randperm(vocab, generator=gen).tolist() if t != favourite])
        off = others[: vocab // 2]
        draft[:, off], draft[:, favourite] = 0, 0
    return target / target.sum(-1, keepdim=True), draft / draft.sum(-1, keepdim=True)


def _exact_law(target: torch.Tensor, draft: torch.Tensor, method: str) -> torch.Tensor:
    """Exact law [V]*(γ+1) of the completed emitted sequence, from the pieces `verify` samples with."""
    gamma, vocab = draft.shape
    if method == "rs":  # every draft sequence, weighted by its probability under q
        drafts = torch.cartesian_prod(*[torch.arange(vocab)] * gamma).reshape(-1, gamma)  # [N, γ]
        weight = draft.gather(-1, drafts.T).prod(0)  # [N]
    else:  # the one greedy draft
        drafts, weight = draft.argmax(-1)[None], torch.ones(1, dtype=draft.dtype)
    n = drafts.shape[0]
    batch_target, batch_draft = target.expand(n, -1, -1), draft.expand(n, -1, -1)
    alpha = acceptance_probs(drafts, batch_target, batch_draft, method)  # [N, γ]
    residual = residual_probs(drafts, batch_target, batch_draft, method)  # [N, γ, V]
    reach = torch.cat([torch.ones(n, 1, dtype=alpha.dtype), alpha.cumprod(-1)], -1)  # [N, γ+1]
    law = torch.zeros([vocab] * (gamma + 1), dtype=alpha.dtype)
    for k in range(gamma + 1):  # exactly k drafts accepted
        stop = reach[:, k] * (1 - alpha[:, k]) if k < gamma else reach[:, k]  # [N]
        nxt = residual[:, k] if k < gamma else target[gamma].expand(n, -1).to(alpha.dtype)  # [N, V]
        prefix = (drafts[:, :k] * vocab ** torch.arange(k - 1, -1, -1)).sum(-1)  # [N] index of ŷ_1..ŷ_k
        head = torch.zeros(vocab**k, vocab, dtype=alpha.dtype).index_add_(0, prefix, (weight * stop)[:, None] * nxt)
        joint = head.flatten()
        for j in range(k + 1, gamma + 1):  # complete the tail with p_{k+2}..p_{γ+1}
            joint = torch.outer(joint, target[j].to(alpha.dtype)).flatten()
        law += joint.reshape(law.shape)
    return law


def _product(target: torch.Tensor) -> torch.Tensor:
    law = target[0]
    for row in target[1:]:
        law = torch.outer(law.flatten(), row).flatten()
    return law.reshape([target.shape[1]] * target.shape[0])


# ---- exactness by enumeration ---------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["rs", "to"])
@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("case", CASES)
def test_emitted_law_is_exactly_the_target(method, gamma, case):
    vocab = 8 if gamma < 3 else 6
    for seed in range(3):
        target, draft = _case(case, gamma, vocab, seed)
        dtype = torch.float32 if case == "nearly_identical" else torch.float64
        law = _exact_law(target.to(dtype), draft.to(dtype), method)
        torch.testing.assert_close(law.double(), _product(target), atol=1e-6, rtol=0)


def test_enumeration_detects_a_wrong_residual(monkeypatch):
    # The enumeration has power: recovering from p instead of the residual breaks exactness.
    target, draft = _case("random", 2, 6, 0)
    monkeypatch.setattr(verify_module, "_residual_weights", lambda target, draft, tokens, method: target.double())
    law = _exact_law(target, draft, "rs")
    assert 0.5 * (law - _product(target)).abs().sum() > 0.05  # total variation, vs the 1e-6 tolerance above


def _markov_law(target: torch.Tensor, start: int, length: int) -> dict[tuple[int, ...], float]:
    """Plain sampling's exact law of `length` tokens from a first-order chain target [V, V] (row = previous token)."""
    law = {(): 1.0}
    for _ in range(length):
        law = {seq + (t,): w * float(target[seq[-1] if seq else start, t]) for seq, w in law.items()
               for t in range(target.shape[1])}
    return law


def _speculative_law(target, draft, start: int, length: int, depth, method: str) -> dict[tuple[int, ...], float]:
    """Exact law of the first `length` tokens when each verification step drafts depth(emitted so far) tokens
    (a chain draft [V, V]) and verifies them against the chain target: enumerated over every draft sequence and
    outcome, with `acceptance_probs` / `residual_probs`, the pieces `verify` samples with."""
    vocab, law = target.shape[0], {}

    def extend(seq: tuple[int, ...], weight: float) -> None:
        if len(seq) >= length:
            law[seq[:length]] = law.get(seq[:length], 0.0) + weight
            return
        gamma, last = depth(seq), seq[-1] if seq else start
        if gamma == 0:  # a plain step samples the next token from p
            for t in range(vocab):
                extend(seq + (t,), weight * float(target[last, t]))
            return
        chains = itertools.product(range(vocab), repeat=gamma) if method == "rs" else [None]
        for chain in chains:
            if chain is None:  # "to": the greedy chain of the draft
                chain, prev = [], last
                for _ in range(gamma):
                    chain.append(int(draft[prev].argmax()))
                    prev = chain[-1]
            context = [last, *chain]  # the token each position is predicted from
            p = target[context][None]  # [1, γ+1, V]
            q = draft[context[:gamma]][None]  # [1, γ, V]
            w = math.prod(float(draft[c, t]) for c, t in zip(context, chain)) if method == "rs" else 1.0
            tokens = torch.tensor([chain], dtype=torch.long).reshape(1, gamma)
            alpha = acceptance_probs(tokens, p, q, method)[0].tolist()  # [γ]
            residual = residual_probs(tokens, p, q, method)[0]  # [γ, V]
            reach = weight * w
            for k in range(gamma + 1):  # exactly k drafts accepted, then a recovered (k < γ) or bonus token
                stop = reach * (1 - alpha[k]) if k < gamma else reach
                nxt = residual[k] if k < gamma else p[0, gamma]
                for t in range(vocab):
                    if stop * float(nxt[t]) > 0:
                        extend(seq + tuple(chain[:k]) + (t,), stop * float(nxt[t]))
                if k < gamma:
                    reach *= alpha[k]

    extend((), 1.0)
    return law


@pytest.mark.parametrize("method", ["rs", "to"])
def test_a_depth_chosen_per_step_from_what_was_emitted_keeps_the_law_exact(method):
    # gamma="auto" decides each step's depth from what earlier steps emitted (bebop.engine.depth), 0 included.
    # Enumerated: whatever that rule, the emitted sequence is exactly plain sampling's.
    gen, vocab, length = _gen(4), 3, 5
    target, draft = _dirichlet((vocab, vocab), gen), _dirichlet((vocab, vocab), gen)
    rules = {"schedule": lambda seq: (2, 0, 1, 2, 0)[min(len(seq), 4)],
             "adaptive": lambda seq: 0 if seq and seq[-1] == 0 else 1 + sum(seq) % 2}
    plain = _markov_law(target, 0, length)
    for name, rule in rules.items():
        law = _speculative_law(target, draft, 0, length, rule, method)
        assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
        worst = max(abs(law.get(seq, 0.0) - w) for seq, w in plain.items())
        assert worst < 1e-12, (name, worst)


def test_the_per_step_depth_enumeration_has_power(monkeypatch):
    # Recovering from p instead of the residual, under the same adaptive rule, is caught far above the tolerance.
    gen, vocab, length = _gen(4), 3, 4
    target, draft = _dirichlet((vocab, vocab), gen), _dirichlet((vocab, vocab), gen)
    monkeypatch.setattr(verify_module, "_residual_weights", lambda target, draft, tokens, method: target.double())
    law = _speculative_law(target, draft, 0, length, lambda seq: (2, 0, 1)[len(seq) % 3], "rs")
    plain = _markov_law(target, 0, length)
    assert 0.5 * sum(abs(law.get(seq, 0.0) - w) for seq, w in plain.items()) > 0.01


# ---- the pieces are what the paper says -----------------------------------------------------------------


def test_acceptance_probs_match_the_paper():
    gen = _gen(1)
    target, draft = _dirichlet((50, 4, 9), gen), _dirichlet((50, 3, 9), gen)
    draft[:, :, :2] = 0  # drafts with q(ŷ) = 0 are accepted iff p(ŷ) > 0 (limit of u·q < p)
    target[:10, :, 0] = 0
    tokens = torch.randint(9, (50, 3), generator=gen)
    p_hat = target[:, :3].gather(-1, tokens[..., None])[..., 0]
    q_hat = draft.gather(-1, tokens[..., None])[..., 0]
    want_rs = torch.where(q_hat > 0, torch.minimum(torch.ones(()), p_hat / q_hat), (p_hat > 0).double())
    torch.testing.assert_close(acceptance_probs(tokens, target, draft, "rs"), want_rs)
    torch.testing.assert_close(acceptance_probs(tokens, target, None, "to"), p_hat)
    greedy = (tokens == target[:, :3].argmax(-1)).double()
    torch.testing.assert_close(acceptance_probs(tokens, target, None, "greedy"), greedy)


def test_expected_first_step_acceptance_is_one_minus_tv():
    target, draft = _dirichlet((1, 2, 7), _gen(2)), _dirichlet((1, 1, 7), _gen(3))
    tokens = torch.arange(7)[:, None]  # every possible draft
    alpha = acceptance_probs(tokens, target.expand(7, -1, -1), draft.expand(7, -1, -1), "rs")[:, 0]
    tv = 0.5 * (target[0, 0] - draft[0, 0]).abs().sum()
    torch.testing.assert_close((draft[0, 0] * alpha).sum(), 1 - tv)


def test_residual_probs_match_the_paper():
    gen = _gen(4)
    target, draft = _dirichlet((20, 3, 9), gen), _dirichlet((20, 2, 9), gen)
    tokens = torch.randint(9, (20, 2), generator=gen)
    positive = (target[:, :2] - draft).clamp_min(0)
    torch.testing.assert_close(residual_probs(tokens, target, draft, "rs"), positive / positive.sum(-1, keepdim=True))
    removed = target[:, :2].scatter(-1, tokens[..., None], 0.0)
    torch.testing.assert_close(residual_probs(tokens, target, None, "to"), removed / removed.sum(-1, keepdim=True))
    one_hot = torch.nn.functional.one_hot(target[:, :2].argmax(-1), 9).double()
    torch.testing.assert_close(residual_probs(tokens, target, None, "greedy"), one_hot)


def test_residual_without_mass_falls_back_to_target():
    target, _ = _case("random", 2, 6, 5)
    target = target[None].float()  # [1, 3, 6]
    tokens = torch.tensor([[0, 3]])
    residual = residual_probs(tokens, target, target[:, :2].clone(), "rs")  # p = q: max(0, p - q) = 0
    torch.testing.assert_close(residual, target[:, :2])
    noisy = target[:, :2].clone()  # q differs from p by rounding-sized amounts: the residual is noise
    noisy[..., 0] += 1e-7
    noisy[..., 1] -= 1e-7
    torch.testing.assert_close(residual_probs(tokens, target, noisy, "rs"), target[:, :2])
    one_hot = torch.nn.functional.one_hot(torch.tensor([[0, 3, 1]]), 6).float()
    residual = residual_probs(tokens, one_hot, None, "to")  # p(ŷ) = 1: nothing left once ŷ is removed
    torch.testing.assert_close(residual, one_hot[:, :2])
    verdict = verify(tokens, one_hot, method="to", generator=_gen(0))
    assert verdict.num_accepted.item() == 2 and verdict.next_token.item() == 1


# ---- statistical checks of `verify` itself --------------------------------------------------------------

ROWS = 100_000


def _first_two_tokens(method: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run verify on ROWS rows sharing p, q; return (pair index, num_accepted, target [3, V], draft [2, V])."""
    target, draft = _case("random", 2, 6, seed)
    gen = _gen(100 + seed)
    batch_target, batch_draft = target.expand(ROWS, -1, -1), draft.expand(ROWS, -1, -1)
    drafts = sample(batch_draft, gen) if method == "rs" else draft.argmax(-1).expand(ROWS, -1)  # [N, 2]
    verdict = verify(drafts, batch_target, batch_draft if method == "rs" else None, method=method, generator=gen)
    n, nxt = verdict.num_accepted, verdict.next_token
    first = torch.where(n >= 1, drafts[:, 0], nxt)
    completion = sample(target[1].expand(ROWS, -1), gen)  # the second token when only one was emitted
    second = torch.where(n >= 2, drafts[:, 1], torch.where(n == 1, nxt, completion))
    return first * 6 + second, n, target, draft


def _pvalue(pairs: torch.Tensor, law: torch.Tensor) -> float:
    counts = torch.bincount(pairs, minlength=law.numel()).double()
    support = law > 0
    assert counts[~support].sum() == 0
    return chisquare(counts[support].numpy(), (law[support] * pairs.numel()).numpy()).pvalue


def _buggy_first_law(target: torch.Tensor, draft: torch.Tensor, method: str) -> torch.Tensor:
    """First-token law if the recovered token were drawn from p instead of the residual (a classic bug)."""
    p, q = target[0], draft[0]
    if method == "rs":
        return torch.minimum(p, q) + (1 - torch.minimum(p, q).sum()) * p
    top = q.argmax()
    law = (1 - p[top]) * p
    law[top] += p[top]
    return law


@pytest.mark.parametrize("method", ["rs", "to"])
def test_first_two_tokens_pass_chi_square(method):
    pairs, n, target, draft = _first_two_tokens(method, seed=0)
    assert _pvalue(pairs, torch.outer(target[0], target[1]).flatten()) > 1e-3
    wrong = torch.outer(_buggy_first_law(target, draft, method), target[1]).flatten()
    assert _pvalue(pairs, wrong) < 1e-3  # the same draws reject a wrong reference: the test has power
    accepted = (n >= 1).double().mean().item()
    want = 1 - 0.5 * (target[0] - draft[0]).abs().sum() if method == "rs" else target[0, draft[0].argmax()]
    stderr = (want * (1 - want) / ROWS) ** 0.5
    assert abs(accepted - want.item()) < 4 * stderr


def test_chi_square_catches_a_buggy_verify(monkeypatch):
    monkeypatch.setattr(verify_module, "_residual_weights", lambda target, draft, tokens, method: target)
    pairs, _, target, _ = _first_two_tokens("rs", seed=0)
    assert _pvalue(pairs, torch.outer(target[0], target[1]).flatten()) < 1e-3


# ---- greedy, determinism, batching ----------------------------------------------------------------------


def _greedy_reference(draft_tokens: torch.Tensor, target: torch.Tensor) -> tuple[list[int], list[int]]:
    best = target.argmax(-1).tolist()
    num, nxt = [], []
    for row, tokens in enumerate(draft_tokens.tolist()):
        k = 0
        while k < len(tokens) and tokens[k] == best[row][k]:
            k += 1
        num.append(k)
        nxt.append(best[row][k])
    return num, nxt


@pytest.mark.parametrize("draft_temperature", [0.0, 1.0])
def test_temperature_zero_targets_reduce_to_greedy(draft_temperature):
    gen = _gen(6)
    target_logits = torch.randn(3000, 4, 10, generator=gen) * 2
    draft_logits = target_logits[:, :3] + torch.randn(3000, 3, 10, generator=gen)  # a draft that often agrees
    target = probs_from_logits(target_logits, 0.0)
    draft = probs_from_logits(draft_logits, draft_temperature)
    want_num, want_next = _greedy_reference(draft_logits.argmax(-1), target)
    greedy = verify(draft_logits.argmax(-1), target, method="greedy")
    assert greedy.num_accepted.tolist() == want_num and greedy.next_token.tolist() == want_next
    assert 0 < sum(want_num) < 3 * 3000  # both acceptances and rejections occur
    for method in ("rs", "to"):
        tokens = sample(draft, gen) if method == "rs" else draft.argmax(-1)
        want_num, want_next = _greedy_reference(tokens, target)
        verdict = verify(tokens, target, draft, method=method, generator=gen)
        assert verdict.num_accepted.tolist() == want_num and verdict.next_token.tolist() == want_next


def _random_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = _gen(seed)
    target, draft = _dirichlet((2000, 4, 10), gen).float(), _dirichlet((2000, 3, 10), gen).float()
    return sample(draft, gen), target, draft


@pytest.mark.parametrize("method", ["rs", "to"])
def test_seeded_determinism(method):
    tokens, target, draft = _random_batch(7)
    runs = [verify(tokens, target, draft, method=method, generator=_gen(seed)) for seed in (1, 1, 2)]
    assert isinstance(runs[0], Verdict)
    assert torch.equal(runs[0].num_accepted, runs[1].num_accepted)
    assert torch.equal(runs[0].next_token, runs[1].next_token)
    assert not torch.equal(runs[0].num_accepted, runs[2].num_accepted)
    assert not torch.equal(runs[0].next_token, runs[2].next_token)


@pytest.mark.parametrize("method", ["rs", "to"])
def test_given_uniforms_decide_acceptance_and_are_what_the_generator_draws(method):
    tokens, target, draft = _random_batch(10)
    tokens = tokens if method == "rs" else draft.argmax(-1)
    uniforms = torch.rand(2000, 4, dtype=torch.float64, generator=_gen(3))  # [B, γ+1]
    given = verify(tokens, target, draft, method=method, uniforms=uniforms)
    drawn = verify(tokens, target, draft, method=method, generator=_gen(3))
    assert torch.equal(given.num_accepted, drawn.num_accepted) and torch.equal(given.next_token, drawn.next_token)
    # Draft i is accepted iff uniforms[:, i] < its acceptance probability, up to the first rejection.
    alpha = acceptance_probs(tokens, target, draft, method)  # [B, γ]
    assert torch.equal(given.num_accepted, (uniforms[:, :3] < alpha).long().cumprod(-1).sum(-1))
    assert 0 < (given.num_accepted == 3).sum() < 2000  # both the bonus and the recovered branch are hit
    with pytest.raises(ValueError, match="uniforms must have shape"):
        verify(tokens, target, draft, method=method, uniforms=uniforms[:, :3])


@pytest.mark.parametrize("method", ["rs", "to"])
def test_verdict_shapes_dtypes_and_ranges(method):
    tokens, target, draft = _random_batch(8)
    target[..., ::3] = 0  # drafts the target rules out must never be emitted
    target /= target.sum(-1, keepdim=True)
    tokens = tokens if method == "rs" else draft.argmax(-1)
    verdict = verify(tokens.int(), target, draft, method=method, generator=_gen(0), validate=False)
    assert verdict.num_accepted.shape == verdict.next_token.shape == (2000,)
    assert verdict.num_accepted.dtype == verdict.next_token.dtype == torch.long
    assert verdict.num_accepted.min() >= 0 and verdict.num_accepted.max() <= 3
    # Every emitted token has positive target probability (its log-prob is what RL consumes).
    positions = torch.arange(4)
    emitted = torch.cat([tokens, verdict.next_token[:, None]], 1)  # [B, γ+1]
    emitted = torch.where(positions < verdict.num_accepted[:, None], emitted, verdict.next_token[:, None])
    is_emitted = positions <= verdict.num_accepted[:, None]  # [B, γ+1]
    assert (target.gather(-1, emitted[..., None])[..., 0][is_emitted] > 0).all()
    empty = verify(tokens[:0], target[:0], draft[:0], generator=_gen(0))
    assert empty.num_accepted.shape == empty.next_token.shape == (0,)


# ---- argument validation --------------------------------------------------------------------------------


def _valid() -> dict:
    tokens, target, draft = _random_batch(9)
    return {"draft_tokens": tokens[:4], "target_probs": target[:4], "draft_probs": draft[:4]}


def _with(**changes) -> dict:
    args = _valid()
    args.update(changes)
    return args


def _bad_cases() -> list[tuple[str, dict, str]]:
    v = _valid()
    tokens, target, draft = v["draft_tokens"], v["target_probs"], v["draft_probs"]
    negative, unnormalised, nan = target.clone(), target.clone(), draft.clone()
    negative[0, 0, 0] = -0.1
    unnormalised[1, 2] *= 1.01
    nan[2, 1, 3] = float("nan")
    out_of_range, negative_id = tokens.clone(), tokens.clone()
    out_of_range[0, 1], negative_id[3, 0] = 10, -1
    return [
        ("draft_tokens 1-D", _with(draft_tokens=tokens[0]), "draft_tokens"),
        ("draft_tokens float", _with(draft_tokens=tokens.float()), "draft_tokens"),
        ("draft_tokens bool", _with(draft_tokens=tokens > 3), "draft_tokens"),
        ("gamma 0", _with(draft_tokens=tokens[:, :0], target_probs=target[:, :1], draft_probs=draft[:, :0]),
         "draft_tokens.*γ = 0"),
        ("target 2-D", _with(target_probs=target[:, 0]), "target_probs"),
        ("target batch", _with(target_probs=target[:3]), "target_probs"),
        ("target positions", _with(target_probs=target[:, :3]), "target_probs"),
        ("target ints", _with(target_probs=target.long()), "target_probs"),
        ("draft missing", _with(draft_probs=None), "draft_probs"),
        ("draft vocab", _with(draft_probs=draft[..., :9]), "draft_probs"),
        ("draft positions", _with(draft_probs=draft[:, :2]), "draft_probs"),
        ("draft ints", _with(draft_probs=draft.long()), "draft_probs"),
        ("token too large", _with(draft_tokens=out_of_range), "draft_tokens.*\\[0, 10\\)"),
        ("token negative", _with(draft_tokens=negative_id), "draft_tokens.*\\[0, 10\\)"),
        ("target negative", _with(target_probs=negative), "target_probs.*negative"),
        ("target sum", _with(target_probs=unnormalised), "target_probs.*sum to 1"),
        ("draft nan", _with(draft_probs=nan), "draft_probs.*non-finite"),
    ]


@pytest.mark.parametrize("label, args, match", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_arguments_raise_naming_the_argument(label, args, match):
    with pytest.raises(ValueError, match=match):
        verify(**args, generator=_gen(0))


def test_unknown_method_raises():
    with pytest.raises(ValueError, match="method"):
        verify(**_valid(), method="typical")
    with pytest.raises(ValueError, match="method"):
        acceptance_probs(*_valid().values(), method="RS")


def test_validate_false_skips_only_the_value_checks():
    args = _valid()
    unnormalised = args["target_probs"].clone()
    unnormalised[1, 2] *= 1.01
    verify(**_with(target_probs=unnormalised), generator=_gen(0), validate=False)  # no host-sync checks
    with pytest.raises(ValueError, match="target_probs"):
        verify(**_with(target_probs=args["target_probs"][:, :3]), validate=False)
    with pytest.raises(ValueError, match="draft_probs"):
        verify(**_with(draft_probs=None), validate=False)
    with pytest.raises(ValueError, match="draft_probs"):
        residual_probs(args["draft_tokens"], args["target_probs"], None, "rs")


def test_draft_probs_are_optional_for_to_and_greedy():
    args = _valid()
    for method in ("to", "greedy"):
        verdict = verify(args["draft_tokens"], args["target_probs"], method=method, generator=_gen(0))
        assert verdict.num_accepted.shape == (4,)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA to check for host syncs")
@pytest.mark.parametrize("method", ["rs", "to", "greedy"])
def test_verify_does_not_sync_on_cuda(method):
    tokens, target, draft = (x.cuda() for x in _random_batch(10))
    gen = torch.Generator(device="cuda").manual_seed(0)
    torch.cuda.set_sync_debug_mode("error")
    try:
        verdict = verify(tokens, target, draft, method=method, generator=gen, validate=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert verdict.num_accepted.device.type == "cuda"
