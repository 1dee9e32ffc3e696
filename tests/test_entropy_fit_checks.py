"""bebop.entropy_law's fits say how much they know: separated clusters, one point that sets the line, nearly empty
bins and near-uniform entropies are flagged, each with the fit it points to instead; a flat cloud and evenly spread
points are not flagged."""

from __future__ import annotations

import math

import pytest
import torch

from bebop.entropy_law import CLUSTER_GAP, NEAR_UNIFORM, SPARSE_SHARE, clusters, fit_entropy_law


def _cloud(n: int, low: float, high: float, intercept: float, slope: float, noise: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    h = low + (high - low) * torch.rand(n, generator=g, dtype=torch.float64)  # [n]
    return h, intercept + slope * h + noise * torch.randn(n, generator=g, dtype=torch.float64)


def test_two_separated_clusters_are_flagged_with_the_slope_inside_the_main_one():
    """A main cluster at 0-0.5 nats with a gentle law (-0.5 per nat) and a small far cluster at 1.5-2 nats sitting
    well below it: the line through both is steep and reads well (R² high), and is mostly the gap between them. The
    flag names both clusters, and the within-cluster fit recovers the main cluster's own slope, with an interval."""
    near_h, near_y = _cloud(50, 0.0, 0.5, 4.0, -0.5, 0.1, seed=0)
    far_h, far_y = _cloud(8, 1.5, 2.0, 1.2, 0.0, 0.1, seed=1)
    fit = fit_entropy_law(torch.cat([near_h, far_h]), torch.cat([near_y, far_y]))
    assert fit.slope < -1.2 and fit.r2 > 0.8  # what an unflagged fit would have reported as the law
    assert fit.flagged and "2 separated clusters" in fit.flags[0]
    assert "50 at 0." in fit.flags[0] and "8 at 1.5" in fit.flags[0]
    within = fit.within
    assert within is not None and within.n == 50 and within.span[1] <= 0.5
    # least squares' standard error of the slope over the main cluster: noise 0.1 / sqrt(Σ(h - h̄)²) ≈ 0.1
    se = 0.1 / float(((near_h - near_h.mean()) ** 2).sum()) ** 0.5
    assert within.slope == pytest.approx(-0.5, abs=4 * se)
    assert within.slope_ci[0] < within.slope < within.slope_ci[1]
    assert within.line() in fit.flags[0] and fit.reading().startswith(fit.line())


def test_a_flat_cloud_is_not_flagged_and_its_interval_holds_zero():
    h, y = _cloud(60, 0.0, 2.0, 2.5, 0.0, 0.2, seed=2)
    fit = fit_entropy_law(h, y)
    assert not fit.flagged and fit.within is None
    assert fit.slope_ci[0] < 0 < fit.slope_ci[1] and fit.r2 < 0.1


def test_evenly_spread_points_are_never_clusters():
    """Four temperatures evenly spaced (a sweep's usual layout) and a dense cloud: one cluster each, however large
    the spacing is against the range."""
    even = torch.tensor([0.2, 0.6, 1.0, 1.4], dtype=torch.float64)
    assert len(clusters(even, torch.ones(4, dtype=torch.float64))) == 1
    fit = fit_entropy_law(even, 3.0 - even + torch.tensor([0.01, -0.02, 0.02, -0.01], dtype=torch.float64))
    assert not fit.flagged
    h, _ = _cloud(200, 0.0, 1.0, 0.0, 0.0, 0.0, seed=3)
    assert len(clusters(h, torch.ones_like(h))) == 1
    # two clusters need a gap of CLUSTER_GAP of the range: a gap of a tenth of it is a cloud's ordinary hole
    gap = torch.cat([torch.linspace(0.0, 1.0, 20), torch.linspace(1.1, 2.0, 20)]).double()
    assert CLUSTER_GAP > 0.1 / 2.0 and len(clusters(gap, torch.ones_like(gap))) == 1


def test_one_heavy_bin_that_sets_the_line_is_flagged_with_the_slope_without_it():
    """The demo's binned law: one bin at 0 nats with most of the drafts accepts far more than the rest, which sit
    flat at 0.55-0.75: the weighted line is the gap between that bin and the others. Without it: flat."""
    h = torch.tensor([0.02, 0.36, 0.66, 0.87, 1.10, 1.37, 1.63, 1.87, 2.12], dtype=torch.float64)
    y = torch.tensor([0.97, 0.67, 0.72, 0.58, 0.72, 0.65, 0.58, 0.60, 0.67], dtype=torch.float64)
    n = torch.tensor([6000, 270, 360, 290, 330, 230, 220, 190, 160], dtype=torch.float64)
    fit = fit_entropy_law(h, y, weights=n)
    assert fit.flagged and fit.flags[0].startswith("one point sets the line (the one at 0.02 nats, 75% of the weight)")
    assert fit.within is not None and fit.within.n == 8
    assert abs(fit.within.slope) < 0.5 * abs(fit.slope) and fit.within.slope_ci[0] < 0 < fit.within.slope_ci[1]


def test_nearly_empty_bins_are_counted_and_near_uniform_points_left_out_of_the_law():
    h = torch.tensor([0.1, 0.4, 0.7, 1.0, 1.3, 2.6], dtype=torch.float64)
    y = 0.9 - 0.2 * h
    n = torch.tensor([500, 400, 300, 200, 100, 3], dtype=torch.float64)  # the last bin: 3 drafts of 1,503
    fit = fit_entropy_law(h, y, weights=n)
    assert fit.sparse == 1 and any(f"under {SPARSE_SHARE:.0%} of the weight" in flag for flag in fit.flags)
    assert fit.slope == pytest.approx(-0.2)
    # A sweep point where the policy is near uniform (8 nats of ln 49,152 = 10.8) accepts nothing: off any line.
    sweep_h = torch.tensor([0.2, 0.4, 0.8, 1.5, 8.0], dtype=torch.float64)
    sweep_y = torch.tensor([0.76, 0.72, 0.64, 0.50, 0.01], dtype=torch.float64)
    ln_v = math.log(49_152)
    law = fit_entropy_law(sweep_h, sweep_y, max_entropy=ln_v)
    assert law.excluded == 1 and law.n == 4 and law.slope == pytest.approx(-0.2)
    assert f"above {NEAR_UNIFORM * ln_v:.1f} nats" in law.flags[0]
    assert fit_entropy_law(sweep_h, sweep_y).slope < -0.05  # without ln V the far point sets a different line
    with pytest.raises(ValueError, match="near uniform"):
        fit_entropy_law(torch.tensor([0.2, 7.0, 8.0, 9.0]), torch.tensor([0.7, 0.1, 0.05, 0.0]), max_entropy=ln_v)
