"""What issue 4 says the shipped heads must show, on 96 held-out math prompts at T = 1 and 48 at T = 0.4, 0.7, 1.3:
RS over TO, TV over CE, and the entropy law's slopes (slow: reads bebop/assets/default)."""

from __future__ import annotations

import pytest
from shipped_claims import NOT_YET, SHIPPED_HEADS, K, claims, difference, load_shipped, slope, swept

from bebop.heads.evaluate import EvalMTPConfig, fit_slopes


@pytest.fixture(scope="module")
def shipped_sweep():
    shipped = load_shipped()
    return (swept(shipped, EvalMTPConfig(heads=SHIPPED_HEADS, temperatures=(1.0,), num_prompts=96,
                                         teacher_forced=False))
            + swept(shipped, EvalMTPConfig(heads=("ce", "e2e_tv"), temperatures=(0.4, 0.7, 1.3), num_prompts=48,
                                           teacher_forced=False)))


# What holds on the shipped heads (measured at T=1, gamma=3; recipe and sweeps in docs/default-model.md), with
# each claim's margin K standard errors of its own measurement (claim_stats), so that noise alone fails it with
# probability < 1e-3. Measured in bf16 (fp32 on a CPU without fast bf16, where the samples differ):
# 96 math prompts: RS ce 73.9 / tv 78.3 / e2e_tv 78.6 % (fp32 73.8 / 79.1 / 79.2), TO 67.1 / 67.6 / 68.6 %
# (fp32 67.7 / 68.7 / 68.5); 384 further prompts: RS 76.1 / 78.3 / 79.4 %, TO 67.0 / 68.2 / 68.9 %.
@pytest.mark.slow
def test_shipped_tv_head_beats_ce_under_rs(shipped_sweep):
    # bf16: +4.34 (SE 1.07)
    diff = difference(shipped_sweep, ("tv", "rs"), ("ce", "rs"))
    assert diff[0] > 2.0 - K * diff[1], claims(tv_minus_ce=diff)  # tv - ce >= 2 points


@pytest.mark.slow
def test_shipped_heads_under_to_tv_and_ce_barely_differ(shipped_sweep):
    # bf16: +0.53 (SE 1.17); fp32: +1.07
    diff = difference(shipped_sweep, ("tv", "to"), ("ce", "to"))
    assert abs(diff[0]) < 1.0 + K * diff[1], claims(tv_minus_ce=diff)  # |tv - ce| < 1 point


@pytest.mark.slow
def test_shipped_heads_rs_beats_to_for_every_head(shipped_sweep):
    # bf16: ce +6.89 (SE 1.10), tv +10.69 (1.18), e2e_tv +9.95 (1.29)
    diffs = {h: difference(shipped_sweep, (h, "rs"), (h, "to")) for h in SHIPPED_HEADS}
    assert all(d > -K * se for d, se in diffs.values()), claims(**diffs)  # RS > TO


@pytest.mark.slow
def test_shipped_heads_to_acceptance_falls_with_entropy(shipped_sweep):
    # bf16: ce -0.33/nat (SE 0.07), e2e_tv -0.52/nat (SE 0.05), over T = 0.4, 0.7, 1.0, 1.3
    slopes = {h: slope(shipped_sweep, h, "to") for h in ("ce", "e2e_tv")}
    assert all(slope < K * se for slope, se in slopes.values()), claims(**slopes)  # slope < 0


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=NOT_YET + ": over 4 temperatures TO+CE falls -0.33/nat and RS+CE -0.19, "
                   "but both bootstrap intervals ([-0.95, 0.16], [-0.39, 0.18]) include 0, and RS+e2e_tv's -0.14 is "
                   "0.41x TO+CE's and 0.70x RS+CE's, not <= 1/3 (TO+e2e_tv: -0.52, CI [-0.54, -0.49])")
def test_shipped_heads_entropy_law_slopes(shipped_sweep):
    rows = [r for r in shipped_sweep if r["head"] in ("ce", "e2e_tv")]
    fits = {(f["head"], f["method"]): f for f in fit_slopes(rows)}
    to, rs_ce, rs_tv = fits[("ce", "to")], fits[("ce", "rs")], fits[("e2e_tv", "rs")]
    assert to["slope_ci"][1] < 0 and rs_ce["slope_ci"][1] < 0, (to, rs_ce)  # clearly negative
    assert abs(rs_tv["slope"]) <= abs(to["slope"]) / 3 and abs(rs_tv["slope"]) <= abs(rs_ce["slope"]) / 3, fits
