"""GRPO math: advantages, the clipped token-mean loss, KL to a reference, the entropy bonus (bebop.rl.grpo)."""

import pytest
import torch

from bebop.rl.grpo import group_advantages, groups_with_signal, grpo_loss, token_entropy, token_logprobs
from bebop.sampling import logprobs_from_logits, scaled_logits


def test_group_advantages_normalise_within_each_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0, 5.0, 5.0, 5.0])
    adv = group_advantages(rewards, 4)
    assert adv.shape == (8,)
    # group 1: mean 0.25, std sqrt(3)/4 -> the winner gets +sqrt(3), the others -1/sqrt(3)
    torch.testing.assert_close(adv[:4], torch.tensor([3**0.5, -(3**-0.5), -(3**-0.5), -(3**-0.5)]), atol=1e-4, rtol=0)
    assert torch.all(adv[4:] == 0)  # a group that all scored the same carries no signal
    assert abs(float(adv[:4].sum())) < 1e-5


def test_groups_with_signal_are_the_groups_that_did_not_all_score_alike():
    assert groups_with_signal(torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0, 5.0, 5.0, 5.0]), 4) == 0.5
    assert groups_with_signal(torch.tensor([0.0, 0.0, 0.0, 0.0]), 2) == 0.0  # no group to learn from: no update
    assert groups_with_signal(torch.tensor([0.0, 1.0, 1.0, 0.0]), 2) == 1.0


@pytest.mark.parametrize("rewards, group", [(torch.zeros(5), 2), (torch.zeros(4), 1), (torch.zeros(2, 2), 2)])
def test_group_advantages_bad_input(rewards, group):
    with pytest.raises(ValueError):
        group_advantages(rewards, group)


def test_token_logprobs_match_log_softmax_with_temperature():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 7, generator=g)
    tokens = torch.randint(0, 7, (2, 3), generator=g)
    got = token_logprobs(logits, tokens, temperature=0.5)
    want = torch.log_softmax(logits / 0.5, -1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_token_logprobs_are_the_sampling_functions_bit_for_bit(temperature):
    """The ratio's numerator comes from bebop.sampling (the engine's distribution), with the arithmetic RL runs
    were trained with: log_softmax(logits.float() / T). Top-k filtered tokens come in as -inf logits."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, 13, generator=g).bfloat16()
    filtered = torch.where(torch.isfinite(scaled_logits(logits, 1.0, top_k=4)), logits.float(), -torch.inf)
    tokens = logits.argmax(-1)  # [2, 5] inside the top-k
    want = logprobs_from_logits(logits, temperature, top_k=4).gather(-1, tokens[..., None])[..., 0]
    assert torch.equal(token_logprobs(filtered, tokens, temperature), want)
    before = torch.log_softmax(logits.float() / temperature, -1).gather(-1, tokens[..., None])[..., 0]
    assert torch.equal(token_logprobs(logits, tokens, temperature), before)


def test_loss_at_ratio_one_is_minus_token_mean_advantage_and_gradient_matches():
    g = torch.Generator().manual_seed(1)
    behaviour = -torch.rand(2, 4, generator=g)
    logp = behaviour.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    loss, stats = grpo_loss(logp, behaviour, adv, mask)
    # 3 tokens with A=1 and 1 with A=-2: token mean = (3 - 2) / 4
    assert float(loss.detach()) == pytest.approx(-(3 * 1.0 - 2.0) / 4)
    loss.backward()
    want = torch.tensor([[-0.25, -0.25, -0.25, 0.0], [0.5, 0.0, 0.0, 0.0]])  # d/dlogp of -ρA/4 at ρ=1
    torch.testing.assert_close(logp.grad, want)
    assert float(stats["ppo_kl"]) == pytest.approx(0.0, abs=1e-7)


def test_clipping_stops_the_gradient_beyond_the_trust_region():
    behaviour = torch.zeros(1, 2)
    logp = torch.tensor([[0.5, 0.05]], requires_grad=True)  # ratios e^0.5 ≈ 1.65 (clipped), e^0.05 (inside)
    loss, stats = grpo_loss(logp, behaviour, torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool), clip_eps=0.2)
    loss.backward()
    assert logp.grad[0, 0] == 0  # positive advantage, ratio above 1+ε: no push further
    assert logp.grad[0, 1] < 0
    assert float(stats["clip_frac"]) == pytest.approx(0.5)
    # with a negative advantage the clipped side is the other one: a ratio far above 1 still gets gradient
    logp.grad = None
    loss, _ = grpo_loss(logp, behaviour, torch.tensor([-1.0]), torch.ones(1, 2, dtype=torch.bool), clip_eps=0.2)
    loss.backward()
    assert logp.grad[0, 0] > 0


def test_masked_tokens_get_no_gradient_and_do_not_count():
    behaviour = torch.zeros(1, 3)
    logp = torch.zeros(1, 3, requires_grad=True)
    mask = torch.tensor([[True, False, True]])
    loss, _ = grpo_loss(logp, behaviour, torch.tensor([2.0]), mask)
    loss.backward()
    assert logp.grad[0, 1] == 0
    assert float(loss.detach()) == pytest.approx(-2.0)


def test_kl_to_reference_is_zero_at_reference_and_pulls_back():
    ref = torch.tensor([[-1.0, -2.0]])
    logp = ref.clone().requires_grad_(True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, stats = grpo_loss(logp, ref, torch.zeros(1), mask, ref_logprobs=ref, kl_coef=0.5)
    assert float(stats["kl_ref"]) == pytest.approx(0.0, abs=1e-7)
    moved = (ref + torch.tensor([[0.3, -0.3]])).requires_grad_(True)
    loss, stats = grpo_loss(moved, ref, torch.zeros(1), mask, ref_logprobs=ref, kl_coef=0.5)
    assert float(stats["kl_ref"]) > 0
    loss.backward()
    assert moved.grad[0, 0] > 0 and moved.grad[0, 1] < 0  # gradient descent moves back toward the reference


def test_grpo_loss_bad_input():
    z = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        grpo_loss(z, torch.zeros(2, 4), torch.zeros(2), m)
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(z, z, torch.zeros(3), m)
    with pytest.raises(ValueError, match="clip_eps"):
        grpo_loss(z, z, torch.zeros(2), m, clip_eps=1.5)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(z, z, torch.zeros(2), m, kl_coef=0.1)
    with pytest.raises(ValueError, match="entropies"):
        grpo_loss(z, z, torch.zeros(2), m, entropy_coef=0.1)
    with pytest.raises(ValueError, match="entropies"):
        grpo_loss(z, z, torch.zeros(2), m, entropies=torch.zeros(2, 4), entropy_coef=0.1)


# ------------------------------------------------------------------------------------------- entropy bonus
def test_token_entropy_is_the_sampled_distributions_and_stays_finite_past_the_vocab_limit():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, 7, generator=g, requires_grad=True)
    got = token_entropy(logits, 0.8, vocab_limit=5)  # [2, 3]
    p = torch.softmax(logits.detach()[..., :5] / 0.8, -1)
    torch.testing.assert_close(got.detach(), -(p * p.log()).sum(-1))
    got.sum().backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[..., 5:] == 0).all()
    one_hot = torch.full((1, 1, 4), -torch.inf)
    one_hot[..., 2] = 0.0
    assert float(token_entropy(one_hot)) == 0.0


def test_entropy_bonus_gradient_is_the_closed_form():
    """d/dz of -c·(token-mean H) at each unmasked position is c·π(log π + H)/(T·n): the docstring's formula."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 6, generator=g, dtype=torch.float64).requires_grad_(True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    behaviour = token_logprobs(logits.detach(), torch.zeros(2, 3, dtype=torch.long)).float()
    c, T = 0.3, 0.7
    entropies = token_entropy(logits, T)  # [2, 3]
    loss, stats = grpo_loss(token_logprobs(logits, torch.zeros(2, 3, dtype=torch.long), T) * 0, behaviour,
                            torch.zeros(2), mask, entropies=entropies, entropy_coef=c)
    loss.backward()
    pi = torch.softmax(logits.detach() / T, -1)
    H = -(pi * pi.log()).sum(-1, keepdim=True)
    want = c * pi * (pi.log() + H) / T * mask[..., None] / mask.sum()
    torch.testing.assert_close(logits.grad, want)
    assert float(stats["entropy_current"]) == pytest.approx(float((H[..., 0] * mask).sum() / mask.sum()), rel=1e-6)
    assert float(stats["entropy_bonus"]) == pytest.approx(c * float(stats["entropy_current"]))


def test_entropy_coefficient_zero_is_the_loss_without_the_bonus_bit_for_bit():
    """The knob at 0 with entropies given changes neither the loss nor its gradient; without entropies the stats are
    the old ones exactly (what a run with the knob off logs)."""
    g = torch.Generator().manual_seed(5)
    behaviour = -torch.rand(2, 4, generator=g)
    logits = torch.randn(2, 4, 9, generator=g)
    tokens = torch.randint(0, 9, (2, 4), generator=g)
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    adv = torch.tensor([0.7, -1.3])
    grads, losses = [], []
    for entropies in (False, True):
        z = logits.clone().requires_grad_(True)
        extra = dict(entropies=token_entropy(z), entropy_coef=0.0) if entropies else {}
        loss, stats = grpo_loss(token_logprobs(z, tokens), behaviour, adv, mask, **extra)
        loss.backward()
        grads.append(z.grad)
        losses.append(loss.detach())
        assert ("entropy_bonus" in stats) == entropies
    assert torch.equal(losses[0], losses[1]) and torch.equal(grads[0], grads[1])


def test_a_positive_coefficient_raises_the_entropy_of_a_softmax_by_gradient_descent():
    logits = torch.tensor([[[3.0, 0.0, -1.0, -2.0]]], requires_grad=True)
    mask = torch.ones(1, 1, dtype=torch.bool)
    start = float(token_entropy(logits.detach()))
    optimizer = torch.optim.SGD([logits], lr=2.0)
    for _ in range(10):
        optimizer.zero_grad()
        loss, _ = grpo_loss(token_logprobs(logits, torch.zeros(1, 1, dtype=torch.long)).detach() * 0,
                            torch.zeros(1, 1), torch.zeros(1), mask, entropies=token_entropy(logits),
                            entropy_coef=0.5)
        loss.backward()
        optimizer.step()
    assert float(token_entropy(logits.detach())) > start + 0.4  # from 0.31 toward log 4 = 1.39
