"""GRPO math: advantages, the clipped token-mean loss, KL to a reference (bebop.rl.grpo)."""

import pytest
import torch

from bebop.rl.grpo import group_advantages, groups_with_signal, grpo_loss, token_logprobs
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
