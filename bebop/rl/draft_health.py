"""Draft-health monitor: does the head still accept what the entropy law says it should?

A draft that silently goes stale or corrupt (a weight sync that skipped the head, a bad checkpoint) shows up as
acceptance falling while the policy's entropy does not explain it. Over the first `fit_steps` RL steps with drafts
the monitor fits the entropy law α ≈ intercept + slope·H (`bebop.entropy_law.fit_entropy_law`, on the steps'
pooled entropy-binned counters) and takes that phase as the reference (α_0, H_0). Then per step:

    predicted   Σ_k reached_k·(intercept + slope·H̄_k) / Σ_k reached_k    the law at this step's entropy mix
    measured    Σ_k accepted_k / Σ_k reached_k                              (bins k of reached draft positions)
    residual    measured - predicted

One step is one draw (its positions are not independent: after a rejection the rest go untested), so the alarm reads
the steps, not the tokens: over the last `window` steps, the drafts-weighted mean residual and its bootstrap interval
(`level`), resampling both the window's steps and the fit phase's steps (each resample refits the law, so a law fixed
by a few steps, or extrapolated far from them, is as uncertain as its steps make it). The alarm fires where that
whole interval lies more than `margin` from 0, never on fewer than `min_window` steps: a lone step far off the line is
noise a bootstrap over steps would not call, a stretch of them is not, and a drift of a few points of acceptance is
what a policy moving under RL does to any law fitted on its first steps, not a fault. Its message
(`draft_health/warning`; the trainer writes it to the run's warnings, `bebop.rl.alerts`) reads the sign: below the law, the draft no longer matches the policy (a stale or
broken head); above it, the policy drafts better than the law fitted on its first steps predicts (the policy sharpened:
the law is stale, not the head). It names the PAPER Eq.-16 term that moved: over the reference, Δα = slope·(H - H_0)
[entropy part] + the rest [mismatch part]; the law predicts the first, so an alarm is the mismatch part moving, and the
message says too when the entropy left the range the law was fitted on (the law extrapolated: PAPER §5's case for
co-training the head).

vLLM's counters are not binned by entropy (it does not say which tokens were drafts), only per draft position. There
each step is one point of the law: its acceptance over reached positions at the step's mean policy entropy
(`actor/entropy`, which the trainer logs on either backend). The law is linear, so its mean over a step's tokens is
its value at their mean entropy; the points' entropies are those of all the step's tokens, not of the reached
positions alone, an offset the fit and every later check share. Steps of one run seldom spread over much entropy,
so the fit phase's points set a slope only when they span a bin (0.25 nats); below, acceptance is taken as flat.

`replay(records)` runs the monitor over a finished run's train records with this code, which is how the dashboard
shows a run written before the alarm read the sign or bootstrapped its steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from bebop.entropy_law import EntropyFit, fit_entropy_law, weighted_line
from bebop.metrics import ENTROPY_BIN_EDGES, binned_acceptance, pool, positions

PREFIX = "draft_health/"
BIN_WIDTH = ENTROPY_BIN_EDGES[1] - ENTROPY_BIN_EDGES[0]  # nats


@dataclass(frozen=True)
class HealthConfig:
    fit_steps: int = 4  # RL steps with drafts that fit the law and set the reference
    window: int = 5  # the latest steps whose mean residual the alarm reads
    min_window: int = 3  # no alarm on fewer steps than this
    level: float = 0.99  # the bootstrap interval's coverage: an alarm should mean something, not 1 stretch in 20
    margin: float = 0.05  # acceptance the whole interval must clear: a smaller drift is no fault worth an alarm
    n_bootstrap: int = 1000

    def __post_init__(self) -> None:
        for name in ("fit_steps", "window", "min_window", "n_bootstrap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.min_window > self.window:
            raise ValueError(f"min_window must be <= window, got {self.min_window} > {self.window}")
        if not 0 < self.level < 1:
            raise ValueError(f"level must lie in (0, 1), got {self.level}")
        if not 0 <= self.margin < 1:
            raise ValueError(f"margin must lie in [0, 1), got {self.margin}")


def _unbinned(counters: Mapping) -> tuple[float, float, float] | None:
    """(accepted, reached) draft positions and the mean policy entropy of a step counted per position only (vLLM's
    counters), or None without them."""
    entropy = float(counters.get("actor/entropy", math.nan))
    needed = ("spec/gamma", "spec/num_drafts", "spec/num_accepted_tokens_per_pos/0")
    if not math.isfinite(entropy) or any(key not in counters for key in needed):
        return None
    per_position = positions(counters)
    return sum(a for _, a in per_position), sum(r for r, _ in per_position), entropy


def _points(counters: Mapping) -> tuple[Tensor, Tensor, Tensor]:
    """The step's points of the law, float64 [points] each: (mean H, acceptance, reached positions) per entropy bin
    (bebop's engine), or one point at the step's mean entropy where only per-position counters exist (vLLM's)."""
    entropy, acceptance, reached = binned_acceptance(counters)
    unbinned = _unbinned(counters) if len(reached) == 0 else None
    if unbinned is not None and unbinned[1] > 0:
        accepted, total, mean_entropy = unbinned
        return tuple(torch.tensor([value], dtype=torch.float64) for value in (mean_entropy, accepted / total, total))
    return entropy, acceptance, reached


def _acceptance(counters: Mapping) -> tuple[float, float, float, float]:
    """(measured acceptance, mean entropy, reached positions, drafts) of reached draft positions in `counters`."""
    entropy, acceptance, reached = _points(counters)
    total = float(reached.sum())
    if total <= 0:
        return math.nan, math.nan, 0.0, 0.0
    return (float((acceptance * reached).sum()) / total, float((entropy * reached).sum()) / total, total,
            float(counters.get("spec/num_drafts", 0)))


def _predicted(fit: EntropyFit, counters: Mapping) -> float:
    entropy, _, reached = _points(counters)
    return float(((fit.intercept + fit.slope * entropy) * reached).sum() / reached.sum())


def _reading(residual: float) -> str:
    """What an alarm's sign says: below the law, the draft has drifted from the policy; above it, the policy drafts
    better than its first steps predicted (the law fitted then no longer describes it, not a fault of the head)."""
    if residual < 0:
        return ("the draft no longer matches the policy: a stale or broken head (a sync that skipped it, a bad "
                "checkpoint?)")
    return ("the draft accepts more than the law fitted on the first steps predicts, as when the policy sharpens: the "
            "law is stale, not the head")


def _table(steps: list[Mapping]) -> tuple[Tensor, Tensor, Tensor]:
    """The fit phase's steps as columns of points: (reached, accepted, entropy sum), each float64 [steps, columns],
    a column per entropy bin (bebop's engine: pooling steps sums a bin's counts) or per step (vLLM's one point)."""
    points = [_points(c) for c in steps]  # per step: (mean H, acceptance, reached) [points]
    if any(len(binned_acceptance(c)[2]) == 0 for c in steps):  # vLLM: step j's point in column j
        k = len(steps)
        reached = torch.diag(torch.cat([p[2] for p in points]))  # [k, k]
        accepted = torch.diag(torch.cat([p[1] * p[2] for p in points]))
        entropy = torch.diag(torch.cat([p[0] * p[2] for p in points]))
        return reached, accepted, entropy
    bins = sorted({b for c in steps for b in _bin_ids(c)})
    rows = [[_bin(c, b) for b in bins] for c in steps]  # [steps][bins] of (reached, accepted, entropy sum)
    table = torch.tensor(rows, dtype=torch.float64).reshape(len(steps), len(bins), 3)  # [k, B, 3]
    return table[..., 0], table[..., 1], table[..., 2]


def _bin_ids(counters: Mapping) -> list[int]:
    prefix, suffix = "spec/by_entropy/", "/num_draft_tokens"
    return [int(key[len(prefix):-len(suffix)]) for key in counters if key.startswith(prefix) and key.endswith(suffix)]


def _bin(counters: Mapping, b: int) -> tuple[float, float, float]:
    return tuple(float(counters.get(f"spec/by_entropy/{b}/{name}", 0.0))
                 for name in ("num_draft_tokens", "num_accepted_tokens", "entropy_sum"))


def _laws(reached: Tensor, accepted: Tensor, entropy: Tensor, index: Tensor, sloped: bool) -> tuple[Tensor, Tensor]:
    """The law refitted on resamples of the fit phase's steps: (intercepts, slopes) [R] for `index` [R, k] (the
    steps each resample draws); flat (slope 0) where the fit is flat or a resample has no spread in entropy."""
    n, a, h = reached[index].sum(1), accepted[index].sum(1), entropy[index].sum(1)  # [R, columns]
    x, y = h / n.clamp_min(1e-12), a / n.clamp_min(1e-12)
    mean = (a.sum(-1) / n.sum(-1))  # [R]: the pooled acceptance
    if not sloped:
        return mean, torch.zeros_like(mean)
    slope, intercept, sxx = weighted_line(x, y, n)  # [R]
    flat = ~(sxx > 1e-12) | ((n > 0).sum(-1) < 3)
    return torch.where(flat, mean, intercept), torch.where(flat, 0.0, slope)


@dataclass(eq=False)
class DraftHealth:
    """Feed it each RL step's counters (`check`); it fits the law on the first steps, then flags stretches of steps
    off it."""

    config: HealthConfig = field(default_factory=HealthConfig)
    fit: EntropyFit | None = None
    _early: list[dict] = field(default_factory=list)  # the fit phase's per-step counters
    _reference: tuple[float, float, float, float] = (math.nan, math.nan, math.nan, math.nan)  # α_0, H_0, H range
    _laws: tuple[Tensor, Tensor] | None = None  # the law refitted on each bootstrap resample of the fit phase [R]
    _recent: list[tuple[float, float, float]] = field(default_factory=list)  # (measured, mean H, drafts) per step

    def check(self, counters: Mapping) -> dict[str, float | str]:
        """The step's `draft_health/*` fields (none before the law is fitted or without drafts); with an alarm,
        `draft_health/warning` says what moved."""
        measured, entropy, reached, drafts = _acceptance(counters)
        if reached <= 0 or drafts <= 0:
            return {}
        if self.fit is None:
            self._early.append(dict(counters))
            if len(self._early) >= self.config.fit_steps:
                self._fit()
            return {}
        self._recent = [*self._recent, (measured, entropy, drafts)][-self.config.window:]
        predicted = _predicted(self.fit, counters)
        mean, lo, hi = self._window()
        margin = self.config.margin
        alarm = len(self._recent) >= self.config.min_window and (lo > margin or hi < -margin)
        alpha_0, h_0, h_min, h_max = self._reference
        entropy_part = self.fit.slope * (entropy - h_0)
        out: dict[str, float | str] = {
            f"{PREFIX}measured": measured, f"{PREFIX}predicted": predicted,
            f"{PREFIX}residual": measured - predicted, f"{PREFIX}window_residual": mean,
            f"{PREFIX}residual_lo": lo, f"{PREFIX}residual_hi": hi,
            f"{PREFIX}entropy_part": entropy_part, f"{PREFIX}mismatch_part": measured - alpha_0 - entropy_part,
            f"{PREFIX}alarm": float(alarm)}
        if alarm:
            outside = "" if h_min <= entropy <= h_max else (
                f"; the entropy {entropy:.2f} left the range the law was fitted on [{h_min:.2f}, {h_max:.2f}], so "
                "the law is extrapolated")
            out[f"{PREFIX}warning"] = (
                f"draft health: over the last {len(self._recent)} steps acceptance ran {abs(mean):.3f} "
                f"{'below' if mean < 0 else 'above'} the entropy law fitted on the first {self.config.fit_steps} "
                f"({self.config.level:.0%} bootstrap interval over steps [{lo:+.3f}, {hi:+.3f}]); this step "
                f"{measured:.3f} vs {predicted:.3f} predicted, Eq.-16 mismatch term "
                f"{out[f'{PREFIX}mismatch_part']:+.3f}, entropy term {entropy_part:+.3f}: {_reading(mean)}{outside}")
        return out

    def _window(self) -> tuple[float, float, float]:
        """The recent steps' drafts-weighted mean residual and its bootstrap interval over steps (module docstring),
        seeded by the step count so a run replays to the same numbers."""
        measured, entropy, drafts = (torch.tensor(column, dtype=torch.float64) for column in zip(*self._recent))
        point = float((drafts * (measured - self.fit.intercept - self.fit.slope * entropy)).sum() / drafts.sum())
        if len(self._recent) < self.config.min_window:
            return point, math.nan, math.nan
        gen = torch.Generator().manual_seed(len(self._early) + len(self._recent))
        intercepts, slopes = self._laws  # [R]
        index = torch.randint(len(measured), (len(intercepts), len(measured)), generator=gen)  # [R, W]
        w = drafts[index]  # [R, W]
        residual = measured[index] - intercepts[:, None] - slopes[:, None] * entropy[index]  # [R, W]
        means = (w * residual).sum(-1) / w.sum(-1)  # [R]
        tail = (1 - self.config.level) / 2
        lo, hi = torch.quantile(means, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
        return point, lo, hi

    def _fit(self) -> None:
        binned = len(binned_acceptance(self._early[0])[2]) > 0
        if binned:  # the steps' bins pooled: a point per bin
            entropy, acceptance, reached = binned_acceptance(pool(self._early))
            spread = 1e-6
        else:  # a point per step, a slope only across a bin's width of entropy (module docstring)
            entropy, acceptance, reached = (torch.cat(column) for column in zip(*map(_points, self._early)))
            spread = BIN_WIDTH
        sloped = int((reached > 0).sum()) >= 3 and float(entropy.max() - entropy.min()) > spread
        if sloped:
            self.fit = fit_entropy_law(entropy, acceptance, weights=reached, n_bootstrap=0)
        else:  # too little entropy spread for a slope: acceptance taken as flat in entropy
            mean = float((acceptance * reached).sum() / reached.sum())
            self.fit = EntropyFit(0.0, mean, math.nan, (math.nan, math.nan), len(entropy))
        gen = torch.Generator().manual_seed(0)
        index = torch.randint(len(self._early), (self.config.n_bootstrap, len(self._early)), generator=gen)  # [R, k]
        self._laws = _laws(*_table(self._early), index, sloped)
        total = float(reached.sum())
        alpha_0, h_0 = float((acceptance * reached).sum()) / total, float((entropy * reached).sum()) / total
        # The law covers the points it was fitted on, each the mean of a bin 0.25 nats wide (ENTROPY_BIN_EDGES) or of
        # a step's tokens: half a bin either side.
        self._reference = (alpha_0, h_0, float(entropy.min()) - BIN_WIDTH / 2, float(entropy.max()) + BIN_WIDTH / 2)


def replay(records: Iterable[Mapping], config: HealthConfig | None = None) -> list[dict[str, float | str]]:
    """The monitor run over a run's train records in order (NaN fields, as pandas fills absent columns, dropped):
    each step's `draft_health/*` fields as this code computes them."""
    health = DraftHealth(config or HealthConfig())
    return [health.check({k: v for k, v in r.items() if not (isinstance(v, float) and math.isnan(v))})
            for r in records]
