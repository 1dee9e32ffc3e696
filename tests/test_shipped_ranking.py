"""What issue 4 says the shipped heads must show, on 384 further held-out math prompts: the RS ranking of the three
losses and the TO spread (slow: reads bebop/assets/default). Its own module, so that `make test`'s workers run it beside
tests/test_shipped_heads.py."""

from __future__ import annotations

import pytest
from shipped_claims import NOT_YET, SHIPPED_HEADS, K, acceptance, claims, difference, load_shipped, swept

from bebop.heads.evaluate import EvalMTPConfig


@pytest.fixture(scope="module")
def ranking_sweep():
    """RS and TO at T=1 on 384 further held-out prompts (seed 2, fixed before it was first measured): the ranking
    and TO-spread claims compare heads about a point apart, which 96 prompts (standard error ~1.1 points per
    difference) cannot resolve; 384 prompts give ~0.5-0.6."""
    return swept(load_shipped(), EvalMTPConfig(heads=SHIPPED_HEADS, methods=("rs", "to"), temperatures=(1.0,),
                                               num_prompts=384, seed=2, teacher_forced=False))


# What holds on the shipped heads (measured at T=1, gamma=3; recipe and sweeps in docs/default-model.md), with
# each claim's margin K standard errors of its own measurement (claim_stats), so that noise alone fails it with
# probability < 1e-3. Measured in bf16 (fp32 on a CPU without fast bf16, where the samples differ):
# 96 math prompts: RS ce 73.9 / tv 78.3 / e2e_tv 78.6 % (fp32 73.8 / 79.1 / 79.2), TO 67.1 / 67.6 / 68.6 %
# (fp32 67.7 / 68.7 / 68.5); 384 further prompts: RS 76.1 / 78.3 / 79.4 %, TO 67.0 / 68.2 / 68.9 %.
@pytest.mark.slow
def test_shipped_heads_rs_acceptance_ranks_e2e_tv_over_tv_over_ce(ranking_sweep):
    # bf16: +1.08 (SE 0.62), +2.13 (0.62), +3.21 (0.60)
    top = difference(ranking_sweep, ("e2e_tv", "rs"), ("tv", "rs"))
    mid = difference(ranking_sweep, ("tv", "rs"), ("ce", "rs"))
    spread = difference(ranking_sweep, ("e2e_tv", "rs"), ("ce", "rs"))
    message = claims(e2e_tv_minus_tv=top, tv_minus_ce=mid, e2e_tv_minus_ce=spread)
    assert top[0] > -K * top[1] and mid[0] > -K * mid[1], message  # e2e_tv > tv >= ce
    assert spread[0] > 3.0 - K * spread[1], message  # e2e_tv - ce >= 3 points


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=NOT_YET + ": on the 384 prompts TO accepts 67.0 / 68.2 / 68.9% (ce / tv / "
                   "e2e_tv), a spread of 1.9 points (2.5 in fp32, where a CPU without native bf16 runs); each rate's standard "
                   "error is ~0.5 and each difference's 0.5-0.6, so the spread sits ~1.7 SE above the claim's line: "
                   "seeded, it fails the same way on a given CPU's dtype")
def test_shipped_heads_under_to_the_loss_barely_matters(ranking_sweep):
    acc = list(acceptance(ranking_sweep, "to").values())
    assert len(acc) == 3 and max(acc) - min(acc) < 1.0, acc
