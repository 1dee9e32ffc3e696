"""Tests for bebop.metrics: counters and pooled rates on a worked example, the entropy law, Eq. 16, RS vs TO,
and the speedup bound. Every expected number below is worked out by hand in the comments."""

import math

import pytest
import torch
from claim_stats import K

from bebop.metrics import (
    ENTROPY_BIN_EDGES,
    Decomposition,
    EntropyFit,
    SpecCounters,
    alpha_rs,
    alpha_to,
    binned_acceptance,
    decompose_acceptance,
    derive,
    expected_tokens_per_step,
    fit_entropy_law,
    pool,
    rs_beats_to,
    theoretical_speedup,
)

# ---------------------------------------------------------------------------------------------------------
# Worked example: γ = 3, three verify steps of two rows. Entropies 0.1 (bin 0), 0.6 (bin 2), 3.5 (bin 12).
# ---------------------------------------------------------------------------------------------------------
STEPS = [
    ([3, 0], [[0.1, 0.1, 0.6], [0.6, 3.5, 3.5]]),
    ([1, 2], [[0.1, 0.6, 3.5], [0.1, 0.1, 3.5]]),
    ([0, 3], [[3.5, 0.1, 0.1], [0.6, 0.6, 0.6]]),
]


def worked_counters() -> SpecCounters:
    counters = SpecCounters(gamma=3, method="rs")
    for n, h in STEPS:
        counters.update(torch.tensor(n), torch.tensor(h))
    return counters


def test_worked_example_counters():
    c = worked_counters()
    assert c.num_drafts == 6 and c.num_draft_tokens == 18
    assert c.num_accepted_tokens == 3 + 0 + 1 + 2 + 0 + 3  # 9
    # position i accepted when n > i: n in {3,0,1,2,0,3}
    assert c.accepted_per_pos == [4, 3, 2]
    # position i reached when n >= i
    assert c.reached_per_pos == [6, 4, 3]
    # Reached positions (up to and including the first rejection), by entropy:
    #   0.1: step1 row0 pos0,1 (acc), step2 row0 pos0 (acc), step2 row1 pos0,1 (acc)      -> 5 reached, 5 accepted
    #   0.6: step1 row0 pos2 (acc), step1 row1 pos0 (rej), step2 row0 pos1 (rej), step3 row1 x3 (acc) -> 6, 4
    #   3.5: step2 row1 pos2 (rej), step3 row0 pos0 (rej)                                    -> 2, 0
    # Unreached, never counted: step1 row1 pos1,2 (3.5), step2 row0 pos2 (3.5), step3 row0 pos1,2 (0.1).
    reached, accepted = [0] * 13, [0] * 13
    reached[0], reached[2], reached[12] = 5, 6, 2
    accepted[0], accepted[2] = 5, 4
    assert c.bin_num_draft_tokens == reached
    assert c.bin_num_accepted_tokens == accepted
    sums = c.bin_entropy_sum
    assert sums[0] == pytest.approx(0.5) and sums[2] == pytest.approx(3.6) and sums[12] == pytest.approx(7.0)
    assert sum(sums) == pytest.approx(11.1)


def test_worked_example_dict_and_rates():
    d = worked_counters().to_dict()
    assert d["spec/gamma"] == 3 and d["spec/method"] == "rs"
    assert d["spec/num_drafts"] == 6 and d["spec/num_draft_tokens"] == 18 and d["spec/num_accepted_tokens"] == 9
    assert [d[f"spec/num_accepted_tokens_per_pos/{i}"] for i in range(3)] == [4, 3, 2]
    assert d["spec/by_entropy/2/num_draft_tokens"] == 6 and d["spec/by_entropy/2/num_accepted_tokens"] == 4
    assert d["spec/by_entropy/12/entropy_sum"] == pytest.approx(7.0)
    assert "spec/by_entropy/13/num_draft_tokens" not in d
    r = derive(d)
    assert r["spec/acceptance_rate"] == pytest.approx(9 / 18)
    assert r["spec/accept_length"] == pytest.approx(1 + 9 / 6)
    assert [r[f"spec/acceptance_rate_pos/{i}"] for i in range(3)] == pytest.approx([4 / 6, 3 / 6, 2 / 6])
    assert [r[f"spec/alpha_pos/{i}"] for i in range(3)] == pytest.approx([4 / 6, 3 / 4, 2 / 3])
    assert r["spec/by_entropy/0/acceptance_rate"] == pytest.approx(1.0)
    assert r["spec/by_entropy/2/acceptance_rate"] == pytest.approx(4 / 6)
    assert r["spec/by_entropy/2/entropy_mean"] == pytest.approx(0.6)
    assert r["spec/by_entropy/12/acceptance_rate"] == 0.0
    assert math.isnan(r["spec/by_entropy/5/acceptance_rate"])  # empty bin: no evidence, not zero
    assert r["spec/entropy_mean"] == pytest.approx(11.1 / 13)
    # Pooled conditional α_i telescope back to the pooled accept length.
    alphas = [r[f"spec/alpha_pos/{i}"] for i in range(3)]
    assert expected_tokens_per_step(alphas, 3) == pytest.approx(r["spec/accept_length"])
    h, a, n = binned_acceptance(d)
    assert h.tolist() == pytest.approx([0.1, 0.6, 3.5]) and a.tolist() == pytest.approx([1.0, 4 / 6, 0.0])
    assert n.tolist() == [5, 6, 2]


def test_pooling_is_a_ratio_of_sums_not_a_mean_of_ratios():
    big = SpecCounters(gamma=3)
    big.update(torch.tensor([3]), torch.full((1, 3), 0.3))  # 3/3 accepted
    small = SpecCounters(gamma=3)
    small.update(torch.tensor([0, 0, 0]), torch.full((3, 3), 0.3))  # 0/9
    records = [big.to_dict(), small.to_dict()]
    mean_of_ratios = sum(derive(r)["spec/acceptance_rate"] for r in records) / 2
    pooled = derive(pool(records))
    assert mean_of_ratios == pytest.approx(0.5)
    assert pooled["spec/acceptance_rate"] == pytest.approx(3 / 12)
    assert pooled["spec/accept_length"] == pytest.approx(1 + 3 / 4)


def test_pool_merge_add_and_round_trip_agree():
    per_step = []
    for n, h in STEPS:
        c = SpecCounters(gamma=3)
        c.update(torch.tensor(n), torch.tensor(h))
        per_step.append(c)
    whole = worked_counters().to_dict()
    records = [{**c.to_dict(), "actor/entropy": 0.4, "step": i} for i, c in enumerate(per_step)]
    records.append({"step": 3, "spec/num_drafts": float("nan")})  # a plain step logged by pandas
    pooled = pool(records)
    assert set(pooled) == set(whole)
    for key, value in whole.items():
        assert pooled[key] == (pytest.approx(value) if isinstance(value, float) else value), key
    assert (per_step[0] + per_step[1] + per_step[2]).to_dict() == pytest.approx(whole)
    merged = SpecCounters(gamma=3).merge(per_step[0]).merge(per_step[1]).merge(per_step[2])
    assert merged.to_dict() == pytest.approx(whole)
    assert per_step[0].num_drafts == 2  # __add__ left its operands alone
    assert SpecCounters.from_dict(pooled).to_dict() == pytest.approx(whole)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_update_stays_on_device_without_syncing():
    counters = SpecCounters(gamma=3)
    steps = [(torch.tensor(n, device="cuda"), torch.tensor(h, device="cuda")) for n, h in STEPS]
    counters.update(*steps[0], validate=False)  # the first call moves the totals and caches the bin edges
    torch.cuda.set_sync_debug_mode("error")  # any device->host wait in update now raises
    try:
        for n, h in steps[1:]:
            counters.update(n, h, validate=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert counters.to_dict() == pytest.approx(worked_counters().to_dict())


def test_counter_errors():
    c = SpecCounters(gamma=3)
    with pytest.raises(ValueError, match="num_accepted"):
        c.update(torch.tensor([4]), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="num_accepted"):
        c.update(torch.tensor([1.0]), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="draft_entropy"):
        c.update(torch.tensor([1]), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="draft_entropy"):
        c.update(torch.tensor([1]), torch.tensor([[0.1, float("nan"), 0.2]]))
    assert c.num_drafts == 0  # a rejected update counts nothing
    with pytest.raises(ValueError, match="gamma"):
        SpecCounters(gamma=0)
    with pytest.raises(ValueError, match="entropy_bin_edges"):
        SpecCounters(gamma=1, entropy_bin_edges=(0.0, 1.0, 0.5, math.inf))
    with pytest.raises(ValueError, match="gamma, method"):
        c.merge(SpecCounters(gamma=3, method="to"))
    to = SpecCounters(gamma=3, method="to").to_dict()
    with pytest.raises(ValueError, match="spec/method"):
        pool([c.to_dict(), to])
    with pytest.raises(ValueError, match="lacks"):
        SpecCounters.from_dict({"spec/gamma": 3, "spec/method": "rs", "spec/num_drafts": 1})
    with pytest.raises(ValueError, match="entropy bins"):
        SpecCounters.from_dict(c.to_dict(), entropy_bin_edges=(0.0, 1.0, math.inf))
    with pytest.raises(ValueError, match="spec/gamma"):
        derive({"spec/num_drafts": 1})


def test_custom_bin_edges_and_edge_placement():
    c = SpecCounters(gamma=1, entropy_bin_edges=(0.0, 0.5, math.inf))
    # 0.5 sits on an edge: it belongs to [0.5, inf). A float-error entropy of -1e-7 belongs to bin 0.
    c.update(torch.tensor([1, 0, 1]), torch.tensor([[0.5], [-1e-7], [7.0]]))
    assert c.bin_num_draft_tokens == [1, 2] and c.bin_num_accepted_tokens == [0, 2]
    assert len(ENTROPY_BIN_EDGES) - 1 == SpecCounters(gamma=1).num_bins


# ---------------------------------------------------------------------------------------------------------
# Entropy law
# ---------------------------------------------------------------------------------------------------------
def synthetic_law(n=200, slope=-1.68, intercept=3.9, noise=0.05, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = 0.1 + 0.5 * torch.rand(n, generator=g, dtype=torch.float64)
    return h, intercept + slope * h + noise * torch.randn(n, generator=g, dtype=torch.float64)


def test_fit_recovers_known_line():
    h, y = synthetic_law()
    fit = fit_entropy_law(h, y, generator=torch.Generator().manual_seed(0))
    assert isinstance(fit, EntropyFit) and fit.n == 200
    # Least squares' standard errors for this design and the known noise 0.05: slope 0.025, intercept 0.0095
    # (the draw lands 0.6 and 0.7 of them off); within K of them whatever the draw, short of a 1e-3 fluke.
    sxx = float(((h - h.mean()) ** 2).sum())
    se_slope, se_intercept = 0.05 / sxx**0.5, 0.05 * (1 / len(h) + float(h.mean()) ** 2 / sxx) ** 0.5
    assert fit.slope == pytest.approx(-1.68, abs=K * se_slope)
    assert fit.intercept == pytest.approx(3.9, abs=K * se_intercept)
    lo, hi = fit.slope_ci  # a 95% interval: about ±1.96 standard errors around the fit (measured 0.102 wide)
    assert lo < fit.slope < hi and hi - lo == pytest.approx(2 * 1.96 * se_slope, rel=0.25)
    assert 0.9 < fit.r2 < 1.0  # 0.95 (expected 0.956: noise 0.05 against a spread of ~0.24 in y), SE ~0.006
    flat = fit_entropy_law(h, 2.6 - 0.06 * h + 0.05 * torch.randn(200, generator=torch.Generator().manual_seed(3),
                                                                      dtype=torch.float64), n_bootstrap=0)
    assert flat.r2 < 0.2 and math.isnan(flat.slope_ci[0])  # 0.049 (expected ~0.035: 0.03 from the slope, ~1/n of noise)


def test_weighted_fit():
    # Integer weights must equal repeating the points.
    h = torch.tensor([0.1, 0.2, 0.35, 0.5, 0.6], dtype=torch.float64)
    y = torch.tensor([3.7, 3.5, 3.3, 3.0, 2.9], dtype=torch.float64)
    w = torch.tensor([1, 3, 2, 5, 1], dtype=torch.float64)
    weighted = fit_entropy_law(h, y, weights=w, n_bootstrap=0)
    repeated = fit_entropy_law(h.repeat_interleave(w.long()), y.repeat_interleave(w.long()), n_bootstrap=0)
    assert weighted.slope == pytest.approx(repeated.slope)
    assert weighted.intercept == pytest.approx(repeated.intercept) and weighted.r2 == pytest.approx(repeated.r2)
    # A heavy line and a light outlier: weights follow the line, the plain fit does not.
    h2 = torch.tensor([0.1, 0.3, 0.5, 0.7], dtype=torch.float64)
    y2 = 3.0 - h2
    y2[3] = 5.0
    heavy = fit_entropy_law(h2, y2, weights=[1000, 1000, 1000, 0.001], n_bootstrap=0)
    plain = fit_entropy_law(h2, y2, n_bootstrap=0)
    assert heavy.slope == pytest.approx(-1.0, abs=1e-3) and plain.slope > 0


def test_bootstrap_is_seeded():
    h, y = synthetic_law(n=40, noise=0.2)
    a = fit_entropy_law(h, y, n_bootstrap=300, generator=torch.Generator().manual_seed(7))
    b = fit_entropy_law(h, y, n_bootstrap=300, generator=torch.Generator().manual_seed(7))
    c = fit_entropy_law(h, y, n_bootstrap=300, generator=torch.Generator().manual_seed(8))
    assert a.slope_ci == b.slope_ci and a.slope_ci != c.slope_ci
    assert fit_entropy_law(h, y, n_bootstrap=300).slope_ci == fit_entropy_law(h, y, n_bootstrap=300).slope_ci


def test_bootstrap_drops_resamples_without_spread():
    # With 3 points, 1 in 9 resamples repeats one point: no slope there, and float error in its zero spread
    # must not leak huge values into the interval. Every other resample's slope lies between the pairwise ones.
    h, y = [0.1, 0.7, 0.3], [3.1, 2.2, 2.6]
    pairwise = [(y[j] - y[i]) / (h[j] - h[i]) for i in range(3) for j in range(i + 1, 3)]
    for w in (None, [0.3, 1.7, 1.1]):
        lo, hi = fit_entropy_law(h, y, weights=w, n_bootstrap=2000).slope_ci
        assert min(pairwise) - 1e-9 <= lo <= hi <= max(pairwise) + 1e-9


def test_fit_errors():
    with pytest.raises(ValueError, match="at least 3"):
        fit_entropy_law([0.1, 0.2], [1.0, 2.0])
    with pytest.raises(ValueError, match="zero variance"):
        fit_entropy_law([0.3, 0.3, 0.3], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="length"):
        fit_entropy_law([0.1, 0.2, 0.3], [1.0, 2.0])
    with pytest.raises(ValueError, match="non-negative"):
        fit_entropy_law([0.1, 0.2, 0.3, 0.4], [1.0, 2.0, 3.0, 4.0], weights=[1, 1, -1, 1])
    with pytest.raises(ValueError, match="finite"):
        fit_entropy_law([0.1, 0.2, float("nan")], [1.0, 2.0, 3.0])


# ---------------------------------------------------------------------------------------------------------
# Eq. 16 decomposition
# ---------------------------------------------------------------------------------------------------------
def test_decomposition_pure_entropy_trajectory():
    steps = torch.arange(50, dtype=torch.float64)
    h = 0.6 - 0.008 * steps + 0.03 * torch.sin(steps)  # entropy collapses during RL, with wiggles
    alpha = 0.9 - 0.3 * h
    d = decompose_acceptance(alpha, h)
    assert isinstance(d, Decomposition) and d.slope == pytest.approx(-0.3)
    assert torch.allclose(d.mismatch_part, torch.zeros(50, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(d.entropy_part, d.total, atol=1e-12)
    assert d.total[-1] > 0.1  # acceptance did rise as entropy fell


def test_decomposition_separates_drift_and_sums_to_total():
    steps = torch.arange(40, dtype=torch.float64)
    h = 0.6 - 0.01 * steps + 0.02 * torch.cos(steps)
    drift = torch.where(steps < 10, 0.0, -0.004 * (steps - 10))  # the draft falls behind after step 10
    d = decompose_acceptance(0.9 - 0.3 * h + drift, h, fit_steps=10, reference_steps=1)
    assert d.slope == pytest.approx(-0.3)
    assert torch.allclose(d.mismatch_part, drift, atol=1e-12)
    noisy = decompose_acceptance(torch.rand(30, generator=torch.Generator().manual_seed(4), dtype=torch.float64),
                                 torch.linspace(0.6, 0.1, 30, dtype=torch.float64))
    assert torch.allclose(noisy.entropy_part + noisy.mismatch_part, noisy.total, atol=1e-15)
    with pytest.raises(ValueError, match="fit_steps"):
        decompose_acceptance(h[:5], h[:5], fit_steps=6)
    with pytest.raises(ValueError, match="reference_steps"):
        decompose_acceptance(h, h, fit_steps=4, reference_steps=5)


# ---------------------------------------------------------------------------------------------------------
# RS vs TO and the speedup bound
# ---------------------------------------------------------------------------------------------------------
def test_decision_boundary():
    p = torch.tensor([
        [0.5, 0.3, 0.2],  # q = p: d_TV = 0 < 1 - 0.5 -> RS
        [0.9, 0.1, 0.0],  # q argmax on a token p never emits: α_TO = 0, α_RS = 0.1 -> RS
        [0.9, 0.05, 0.05],  # q spread but argmax right: α_RS = 0.5 < α_TO = 0.9 -> TO
        [0.5, 0.5, 0.0],  # tie: d_TV = 0.5 = 1 - p(argmax q) -> not RS
        [0.0, 1.0, 0.0],  # one-hot, identical: both accept surely -> not RS
    ])
    q = torch.tensor([[0.5, 0.3, 0.2], [0.0, 0.1, 0.9], [0.4, 0.3, 0.3], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    assert alpha_rs(p, q).tolist() == pytest.approx([1.0, 0.1, 0.5, 0.5, 1.0])
    assert alpha_to(p, q).tolist() == pytest.approx([0.5, 0.0, 0.9, 0.5, 1.0])
    assert rs_beats_to(p, q).tolist() == [True, True, False, False, False]
    assert rs_beats_to(p.reshape(5, 1, 3), q.reshape(5, 1, 3)).shape == (5, 1)
    with pytest.raises(ValueError, match="shape"):
        rs_beats_to(p, q[:, :2])
    with pytest.raises(ValueError, match="draft_probs"):
        rs_beats_to(p, q * 2)


def test_expected_tokens_and_speedup():
    assert expected_tokens_per_step(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens_per_step(1.0, 3) == pytest.approx(4.0)
    assert expected_tokens_per_step(0.0, 3) == pytest.approx(1.0)
    assert expected_tokens_per_step(0.8, 3) == pytest.approx((1 - 0.8**4) / (1 - 0.8))
    assert expected_tokens_per_step([1.0, 0.5, 0.5], 3) == pytest.approx(1 + 1 + 0.5 + 0.25)
    assert expected_tokens_per_step([0.7] * 4, 4) == pytest.approx(expected_tokens_per_step(0.7, 4))
    assert expected_tokens_per_step(torch.tensor(0.5), 2) == pytest.approx(1.75)
    assert expected_tokens_per_step(torch.tensor([0.5, 0.5]), 2) == pytest.approx(1.75)
    assert theoretical_speedup(0.5, 1, draft_cost=0.1) == pytest.approx(1.5 / 1.1)
    assert theoretical_speedup(0.8, 3, draft_cost=0.05, verify_cost=1.2) == pytest.approx(2.952 / 1.35)
    assert theoretical_speedup(0.0, 2, draft_cost=0.5) == pytest.approx(0.5)  # drafting that never hits loses
    assert theoretical_speedup(1.0, 3, draft_cost=0.0) == pytest.approx(4.0)
    for bad in (dict(alpha=1.2, gamma=3), dict(alpha=-0.1, gamma=3), dict(alpha=0.5, gamma=0),
                dict(alpha=[0.5, 0.5], gamma=3)):
        with pytest.raises(ValueError):
            expected_tokens_per_step(**bad)
    with pytest.raises(ValueError, match="verify_cost"):
        theoretical_speedup(0.5, 3, draft_cost=0.1, verify_cost=0.0)
    with pytest.raises(ValueError, match="draft_cost"):
        theoretical_speedup(0.5, 3, draft_cost=-0.1)
