"""The entropy law and PAPER Eq. 16: how acceptance moves with the policy's entropy.

Finding 1 says acceptance falls about linearly with the target's entropy: α ≈ intercept + slope·H (PAPER's b is
-slope). `fit_entropy_law` fits that line by (weighted) least squares, with a bootstrap interval on the slope,
to per-token or per-bin points, and says how much the points can support it: every place that fits or quotes the
law (eval-mtp, the dashboard, the notebooks, `bebop.claims`, `bebop.rl.shadow_summary`) reads the same `EntropyFit`
and its `reading()`. A fit is flagged where its line is set by the layout of the points rather than by a trend
through them:

    clusters      the entropies fall in separated clusters (a gap of at least CLUSTER_GAP of the range,
                  CLUSTER_RATIO times the median gap between neighbours and wider than any gap inside the clusters
                  it separates): the line is mostly the difference between the clusters; `within` is the fit inside
                  the heaviest cluster
    influence     one point moves the slope by more than INFLUENCE of itself (a heavy bin at 0 nats, a lone far
                  step): `within` is the fit without it
    sparse        binned points holding under SPARSE_SHARE of the weight each: nearly empty bins, shown as such
    near uniform  points above NEAR_UNIFORM·ln V nats (with `max_entropy` = ln V given), where the policy is close
                  to uniform over its vocabulary, are left out of the law (`excluded`) and said to be

`decompose_acceptance` splits an acceptance trajectory over RL steps into the part the entropy change alone predicts
and the rest, the draft drifting away from the policy (Eq. 16). `bebop.metrics` re-exports both, so callers keep
importing them from there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

CLUSTER_GAP = 0.25  # share of the entropy range a gap must span to separate clusters ...
CLUSTER_RATIO = 4.0  # ... and how many median neighbour gaps (evenly spread points are never clusters)
INFLUENCE = 0.5  # a point whose removal moves the slope by more than this share of it sets the line
SPARSE_SHARE = 0.01  # a binned point with less than this share of the weight is nearly empty
NEAR_UNIFORM = 0.7  # of ln V: above it the policy is near uniform and its acceptance says nothing of the law


@dataclass(frozen=True)
class EntropyFit:
    """acceptance ≈ intercept + slope·H. PAPER's b is -slope. r2 is NaN when the acceptance is constant.

    `flags` says, in words with their numbers, what the points cannot support (module docstring); `within` is the fit
    a flag points to instead (inside the main cluster, or without the point that sets the line), None when there is
    none; `excluded` counts near-uniform points left out; `sparse` the nearly empty bins kept in."""

    slope: float
    intercept: float
    r2: float
    slope_ci: tuple[float, float]  # bootstrap percentile 95% interval; NaN when n_bootstrap = 0
    n: int
    span: tuple[float, float] = (math.nan, math.nan)  # the entropies the line was fitted over (min, max)
    flags: tuple[str, ...] = ()
    within: EntropyFit | None = None
    excluded: int = 0
    sparse: int = 0
    layout: bool = False  # the line rests on the layout of its points (separated clusters, one point that sets it)

    @property
    def flagged(self) -> bool:
        return bool(self.flags)

    def supports(self, holds) -> bool:
        """Whether `holds(fit)` is true of this fit and, where the line rests on the layout of its points, of the fit
        a flag points to as well (None there: nothing supports it). A claim true only across clusters does not hold."""
        return bool(holds(self)) and (not self.layout or (self.within is not None and bool(holds(self.within))))

    def line(self, unit: str = "per nat") -> str:
        """The slope with its interval, R² and points, e.g. "-1.19 [-1.28, -1.12] per nat, R² 0.86, 60 points"."""
        ci = "" if math.isnan(self.slope_ci[0]) else f" [{self.slope_ci[0]:+.2f}, {self.slope_ci[1]:+.2f}]"
        r2 = "—" if math.isnan(self.r2) else f"{self.r2:.2f}"
        return f"{self.slope:+.2f}{ci} {unit}, R² {r2}, {self.n} points"

    def reading(self, unit: str = "per nat") -> str:
        """`line()` and, for a flagged fit, each flag (the within fit's line in it): what to quote."""
        return "; ".join([self.line(unit), *self.flags])


def _as_vector(name: str, values) -> Tensor:
    # A copy, not a view: read-only numpy inputs (pandas .to_numpy()) would make torch warn.
    x = torch.tensor(values, dtype=torch.float64) if not isinstance(values, Tensor) else values.detach().double().cpu()
    if x.dim() != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} must be finite")
    return x


def weighted_line(x: Tensor, y: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Weighted least squares along the last dim: x, y, w [..., n] -> slope, intercept, x spread [...]."""
    w = w / w.sum(-1, keepdim=True)
    x_mean, y_mean = (w * x).sum(-1), (w * y).sum(-1)
    dx = x - x_mean[..., None]
    sxx = (w * dx * dx).sum(-1)
    slope = (w * dx * (y - y_mean[..., None])).sum(-1) / sxx
    return slope, y_mean - slope * x_mean, sxx


def _line(x: Tensor, y: Tensor, w: Tensor, n_bootstrap: int, generator: torch.Generator | None) -> EntropyFit:
    """The weighted line through x, y, w [n] with its bootstrap interval, no diagnostics."""
    if int((w > 0).sum()) < 3:
        raise ValueError("need at least 3 points with positive weight (weights must be non-negative)")
    slope, intercept, sxx = weighted_line(x, y, w)
    if not float(sxx) > 1e-12 * max(1.0, float(x.abs().max()) ** 2):
        raise ValueError("entropy has (almost) zero variance: the slope is undefined")
    wn = w / w.sum()
    ss_res = float((wn * (y - intercept - slope * x) ** 2).sum())
    ss_tot = float((wn * (y - (wn * y).sum()) ** 2).sum())
    ci = (math.nan, math.nan)
    if n_bootstrap > 0:
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        idx = torch.randint(len(x), (n_bootstrap, len(x)), generator=gen, device=gen.device).cpu()  # [R, n]
        boot, _, boot_sxx = weighted_line(x[idx], y[idx], w[idx])  # [R]
        boot = torch.where(boot_sxx > 1e-12 * float(sxx), boot, math.nan)
        lo, hi = torch.nanquantile(boot, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
        ci = (lo, hi)
    fitted = x[w > 0]
    return EntropyFit(float(slope), float(intercept), 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan, ci,
                      int((w > 0).sum()), (float(fitted.min()), float(fitted.max())))


def clusters(x: Tensor, w: Tensor) -> list[Tensor]:
    """The points x, w [n] split into separated clusters (module docstring), as boolean masks [n] in entropy order;
    one mask (all points) when they are not separated. A cluster holds at least two distinct entropies: a lone point
    far out is a matter of influence, not of clusters."""
    values = torch.unique(x[w > 0])  # sorted distinct entropies [m]
    if len(values) < 4:
        return [w > 0]
    gaps = values.diff()  # [m-1]; gap i lies between values i and i+1
    span = float(values[-1] - values[0])
    order = gaps.argsort(descending=True)
    typical = float(gaps[order[1:]].median())
    cuts = sorted(i for i in order.tolist() if 1 <= i <= len(values) - 3
                  and gaps[i] >= CLUSTER_GAP * span and gaps[i] >= CLUSTER_RATIO * typical)
    while True:  # a cluster is tighter than the gap around it: a cut no wider than a gap inside its sides goes
        bounds = [-1, *cuts, len(gaps)]
        inside = [float(gaps[a + 1:b].max()) if b > a + 1 else 0.0 for a, b in zip(bounds[:-1], bounds[1:])]
        loose = [cut for k, cut in enumerate(cuts) if gaps[cut] <= max(inside[k], inside[k + 1])]
        if not loose:
            break
        cuts.remove(min(loose, key=lambda cut: float(gaps[cut])))
    edges = [-math.inf, *(float(values[cut]) for cut in cuts), math.inf]  # a cut is a cluster's last entropy
    return [(w > 0) & (x > lo) & (x <= hi) for lo, hi in zip(edges[:-1], edges[1:])]


def _leave_one_out(x: Tensor, y: Tensor, w: Tensor) -> Tensor:
    """The slope without each point in turn, [n] (NaN where the rest has no spread or under 3 points)."""
    keep = w.expand(len(x), -1).clone()  # [n, n]
    keep.fill_diagonal_(0.0)
    slope, _, sxx = weighted_line(x.expand_as(keep), y.expand_as(keep), keep)  # [n]
    enough = ((keep > 0).sum(-1) >= 3) & (sxx > 1e-12)
    return torch.where(enough, slope, math.nan)


def _span(x: Tensor, mask: Tensor) -> str:
    return f"{int(mask.sum())} at {float(x[mask].min()):.2f}-{float(x[mask].max()):.2f} nats"


def _diagnose(fit: EntropyFit, x: Tensor, y: Tensor, w: Tensor, n_bootstrap: int,
              generator: torch.Generator | None) -> tuple[list[str], EntropyFit | None]:
    """(flags, within fit) of a fit over x, y, w [n]: separated clusters first, else one point that sets the line."""
    parts = clusters(x, w)
    if len(parts) > 1:
        main = max(parts, key=lambda mask: float(w[mask].sum()))
        sides = ", ".join(_span(x, mask) for mask in parts)
        try:
            within = _line(x[main], y[main], w[main], n_bootstrap, generator)
        except ValueError:
            return [f"entropies in {len(parts)} separated clusters ({sides}): too few points inside one for a slope, "
                    "so the line is the gap between them"], None
        return [f"entropies in {len(parts)} separated clusters ({sides}): the line is mostly the gap between them; "
                f"within the largest, {within.line()}"], within
    if len(x) < 4 or fit.slope == 0:
        return [], None
    moved = (_leave_one_out(x, y, w) - fit.slope).abs()  # [n]
    if not bool(torch.isfinite(moved).any()) or float(moved.nan_to_num(0).max()) <= INFLUENCE * abs(fit.slope):
        return [], None
    i = int(moved.nan_to_num(-1).argmax())
    rest = torch.arange(len(x)) != i
    within = _line(x[rest], y[rest], w[rest], n_bootstrap, generator)
    share = float(w[i] / w.sum())
    return [f"one point sets the line (the one at {float(x[i]):.2f} nats, {share:.0%} of the weight): without it, "
            f"{within.line()}"], within


def fit_entropy_law(entropy, acceptance, *, weights=None, n_bootstrap: int = 1000,
                    generator: torch.Generator | None = None, max_entropy: float | None = None) -> EntropyFit:
    """Fit acceptance = intercept + slope·entropy by (weighted) least squares, and flag what the points cannot
    support (module docstring).

    Weights are counts when fitting binned points (`binned_acceptance`). The 95% slope interval resamples the
    points with replacement `n_bootstrap` times; resamples with no spread in entropy are dropped. Without a
    generator a fixed seed (0) is used, so the interval is reproducible. `max_entropy` (ln V, the entropy of the
    uniform distribution over the vocabulary): points above NEAR_UNIFORM of it are left out of the law.
    """
    x, y = _as_vector("entropy", entropy), _as_vector("acceptance", acceptance)
    w = torch.ones_like(x) if weights is None else _as_vector("weights", weights)
    if not x.shape == y.shape == w.shape:
        raise ValueError(f"entropy, acceptance and weights differ in length: {len(x)}, {len(y)}, {len(w)}")
    if bool((w < 0).any()):
        raise ValueError("need at least 3 points with positive weight (weights must be non-negative)")
    if n_bootstrap < 0:
        raise ValueError(f"n_bootstrap must be >= 0, got {n_bootstrap}")
    flags = []
    uniform = x > NEAR_UNIFORM * max_entropy if max_entropy is not None else torch.zeros_like(x, dtype=torch.bool)
    excluded = int((uniform & (w > 0)).sum())
    if excluded:
        flags.append(f"{excluded} point(s) above {NEAR_UNIFORM * max_entropy:.1f} nats (the policy near uniform over "
                     f"its vocabulary, ln V = {max_entropy:.1f}) left out of the law")
        if int((~uniform & (w > 0)).sum()) < 3:
            raise ValueError(f"fewer than 3 points below {NEAR_UNIFORM * max_entropy:.1f} nats, where the policy is "
                             "not near uniform: no law to fit")
        x, y, w = x[~uniform], y[~uniform], w[~uniform]
    fit = _line(x, y, w, n_bootstrap, generator)
    caveats, within = _diagnose(fit, x, y, w, n_bootstrap, generator)
    layout = bool(caveats)  # clusters or one point that sets the line (the sparse-bin count follows)
    sparse = int(((w > 0) & (w < SPARSE_SHARE * w.sum())).sum()) if bool((w != w[0]).any()) else 0
    if sparse:
        caveats.append(f"{sparse} nearly empty bin(s) (under {SPARSE_SHARE:.0%} of the weight each)")
    return EntropyFit(fit.slope, fit.intercept, fit.r2, fit.slope_ci, fit.n, fit.span, tuple(flags + caveats),
                      within, excluded, sparse, layout)


@dataclass(frozen=True)
class Decomposition:
    """PAPER Eq. 16 over steps t: total_t = α_t - α_0 = entropy_part_t + mismatch_part_t (all [S] float64)."""

    total: Tensor
    entropy_part: Tensor  # slope·(H_t - H_0): what the entropy change alone predicts
    mismatch_part: Tensor  # the rest: the draft drifting away from (or towards) the policy
    slope: float  # dα/dH fitted on the early phase (PAPER's b is -slope)


def decompose_acceptance(acceptance, entropy, *, fit_fraction: float = 0.2, fit_steps: int | None = None,
                         reference_steps: int = 3) -> Decomposition:
    """Split the change of an acceptance trajectory [S] into an entropy part and a mismatch part.

    The slope is fitted on the first `fit_steps` points (default ceil(fit_fraction·S), at least 3), where
    the draft still matches the policy it was trained for. The t = 0 reference (α_0, H_0) is the mean of the
    first `reference_steps` points rather than the single first step: one step's acceptance is noisy, and
    since a mean of points on a line lies on the line, an exact entropy law still gives a zero mismatch.
    `acceptance` may be the acceptance rate or the accept length (the parts are in its units).
    """
    alpha, h = _as_vector("acceptance", acceptance), _as_vector("entropy", entropy)
    if alpha.shape != h.shape:
        raise ValueError(f"acceptance and entropy differ in length: {len(alpha)} vs {len(h)}")
    if fit_steps is None:
        if not 0 < fit_fraction <= 1:
            raise ValueError(f"fit_fraction must lie in (0, 1], got {fit_fraction}")
        fit_steps = max(3, math.ceil(fit_fraction * len(alpha)))
    if not 3 <= fit_steps <= len(alpha):
        raise ValueError(f"fit_steps must lie in 3..{len(alpha)} (the trajectory length), got {fit_steps}")
    if not 1 <= reference_steps <= fit_steps:
        raise ValueError(f"reference_steps must lie in 1..fit_steps={fit_steps}, got {reference_steps}")
    slope = fit_entropy_law(h[:fit_steps], alpha[:fit_steps], n_bootstrap=0).slope
    total = alpha - alpha[:reference_steps].mean()  # [S]
    entropy_part = slope * (h - h[:reference_steps].mean())  # [S]
    return Decomposition(total, entropy_part, total - entropy_part, slope)
