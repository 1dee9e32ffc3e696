"""Standard errors for the tests that assert measured claims (issue 16).

A measured claim (an acceptance ranking, a spread, a slope, a reward that rises) is asserted with a margin of
K standard errors of the measurement itself, never with a bare threshold that sampling noise can cross (a CPU
without fast bf16 runs fp32, draws other samples, and moves every measured number by about one standard error):

    claim  A > B + c          assert  A - B > c - K·SE(A - B)
    claim  |A - B| < c        assert  |A - B| < c + K·SE(A - B)
    claim  x = x0             assert  |x - x0| < K·SE(x)

so a test fails only when the measurement contradicts the claim by more than K standard errors. K = 3.5 gives a
one-sided false-failure rate of 2e-4 for a normal estimate and 5e-4 when the SE itself is estimated from 48
independent units (Student t, 47 df); two-sided, twice that. An SE estimated from fewer units (a handful of
training runs) uses `t_margin(df)` instead: the same 5e-4 tail of Student's t (4.78 at 9 df).

A claim that an effect exists ("a working gradient raises the reward") is asserted as effect > K·SE: the null
it rejects is "no effect", and the test states how far above the bar the effect was measured to sit.

Units: the SE is computed over the independent units of the measurement (prompts, completions, steps), never
over correlated pieces of one unit. The drafts of one verify step are not independent (after a rejection the
later positions are not even tested), nor are the steps of one completion (an easy prompt accepts throughout):
the shipped heads' acceptance rates have a standard error 1.5-2x the binomial sqrt(p(1-p)/n) over draft tokens,
so the tests resample whole prompts (`jackknife_se`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

K = 3.5


def jackknife_se(statistic: Callable[[int], float], n: int) -> float:
    """Delete-one jackknife standard error over n independent units: statistic(i) is the estimate recomputed
    without unit i. Units of several samples that share an index (the same prompt under two heads) are left out
    together, so a paired difference gets the smaller SE of its pairing."""
    if n < 2:
        raise ValueError(f"a jackknife needs at least 2 units, got {n}")
    values = [statistic(i) for i in range(n)]
    mean = sum(values) / n
    return math.sqrt((n - 1) / n * sum((v - mean) ** 2 for v in values))


def t_margin(df: int) -> float:
    """The margin in standard errors for an SE estimated with df degrees of freedom: Student's t quantile with a
    one-sided tail of 5e-4 (3.51 at 47 df, where K = 3.5 stands for it; 4.78 at 9 df)."""
    from scipy.stats import t

    return float(t.ppf(1 - 5e-4, df))


def pooled_sd(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """Standard deviation of independent values pooled over groups that share it (each group about its own mean),
    and its degrees of freedom."""
    df = sum(len(g) - 1 for g in groups)
    if df < 1:
        raise ValueError("a pooled standard deviation needs a group with at least 2 values")
    ss = sum(sum((v - sum(g) / len(g)) ** 2 for v in g) for g in groups)
    return math.sqrt(ss / df), df
