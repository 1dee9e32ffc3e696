"""The entropy law and PAPER Eq. 16: how acceptance moves with the policy's entropy.

Finding 1 says acceptance falls about linearly with the target's entropy: α ≈ intercept + slope·H (PAPER's b is
-slope). `fit_entropy_law` fits that line by (weighted) least squares, with a bootstrap interval on the slope,
to per-token or per-bin points. `decompose_acceptance` splits an acceptance trajectory over RL steps into the part
the entropy change alone predicts and the rest, the draft drifting away from the policy (Eq. 16).
`bebop.metrics` re-exports both, so callers keep importing them from there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class EntropyFit:
    """acceptance ≈ intercept + slope·H. PAPER's b is -slope. r2 is NaN when the acceptance is constant."""

    slope: float
    intercept: float
    r2: float
    slope_ci: tuple[float, float]  # bootstrap percentile 95% interval; NaN when n_bootstrap = 0
    n: int


def _as_vector(name: str, values) -> Tensor:
    # A copy, not a view: read-only numpy inputs (pandas .to_numpy()) would make torch warn.
    x = torch.tensor(values, dtype=torch.float64) if not isinstance(values, Tensor) else values.detach().double().cpu()
    if x.dim() != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} must be finite")
    return x


def _wls(x: Tensor, y: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Weighted least squares along the last dim: x, y, w [..., n] -> slope, intercept, x spread [...]."""
    w = w / w.sum(-1, keepdim=True)
    x_mean, y_mean = (w * x).sum(-1), (w * y).sum(-1)
    dx = x - x_mean[..., None]
    sxx = (w * dx * dx).sum(-1)
    slope = (w * dx * (y - y_mean[..., None])).sum(-1) / sxx
    return slope, y_mean - slope * x_mean, sxx


def fit_entropy_law(entropy, acceptance, *, weights=None, n_bootstrap: int = 1000,
                    generator: torch.Generator | None = None) -> EntropyFit:
    """Fit acceptance = intercept + slope·entropy by (weighted) least squares.

    Weights are counts when fitting binned points (`binned_acceptance`). The 95% slope interval resamples the
    points with replacement `n_bootstrap` times; resamples with no spread in entropy are dropped. Without a
    generator a fixed seed (0) is used, so the interval is reproducible.
    """
    x, y = _as_vector("entropy", entropy), _as_vector("acceptance", acceptance)
    w = torch.ones_like(x) if weights is None else _as_vector("weights", weights)
    if not x.shape == y.shape == w.shape:
        raise ValueError(f"entropy, acceptance and weights differ in length: {len(x)}, {len(y)}, {len(w)}")
    if bool((w < 0).any()) or int((w > 0).sum()) < 3:
        raise ValueError("need at least 3 points with positive weight (weights must be non-negative)")
    if n_bootstrap < 0:
        raise ValueError(f"n_bootstrap must be >= 0, got {n_bootstrap}")
    slope, intercept, sxx = _wls(x, y, w)
    if not float(sxx) > 1e-12 * max(1.0, float(x.abs().max()) ** 2):
        raise ValueError("entropy has (almost) zero variance: the slope is undefined")
    wn = w / w.sum()
    ss_res = float((wn * (y - intercept - slope * x) ** 2).sum())
    ss_tot = float((wn * (y - (wn * y).sum()) ** 2).sum())
    ci = (math.nan, math.nan)
    if n_bootstrap > 0:
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        idx = torch.randint(len(x), (n_bootstrap, len(x)), generator=gen, device=gen.device).cpu()  # [R, n]
        boot, _, boot_sxx = _wls(x[idx], y[idx], w[idx])  # [R]
        boot = torch.where(boot_sxx > 1e-12 * float(sxx), boot, math.nan)
        lo, hi = torch.nanquantile(boot, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
        ci = (lo, hi)
    return EntropyFit(float(slope), float(intercept), 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan,
                      ci, len(x))


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
