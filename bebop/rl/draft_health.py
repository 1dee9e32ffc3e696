"""Draft-health monitor: does the head still accept what the entropy law says it should?

A draft that silently goes stale or corrupt (a weight sync that skipped the head, a bad checkpoint) shows up as
acceptance falling while the policy's entropy does not explain it. Over the first `fit_steps` RL steps with drafts
the monitor fits the entropy law α ≈ intercept + slope·H (`bebop.entropy_law.fit_entropy_law`, on the steps'
pooled entropy-binned counters) and takes that phase as the reference (α_0, H_0). Then per step:

    predicted   Σ_k reached_k·(intercept + slope·H̄_k) / Σ_k reached_k    the law at this step's entropy mix
    measured    Σ_k accepted_k / Σ_k reached_k                              (bins k of reached draft positions)
    residual    measured - predicted,  interval  ± z·sqrt(m(1-m)/drafts + s²)

The interval counts verify steps (`spec/num_drafts`), not draft tokens, as the independent trials (the positions of
one draft are not independent: after a rejection the rest go untested), and adds s, the scatter of the fit phase's
own per-step residuals (what the law does not explain even while the draft is healthy). A residual whose interval
excludes 0 raises the alarm, whose message (`draft_health/warning`; the trainer writes it to the run's warnings,
`bebop.rl.alerts`) names the PAPER Eq.-16 term that moved: over the reference, Δα = slope·(H - H_0)
[entropy part] + the rest [mismatch part]; the law predicts the first, so an alarm is the mismatch part moving (the
draft and the policy parting), and the message says too when the entropy left the range the law was fitted on (the
law extrapolated: PAPER §5's case for co-training the head).

vLLM's counters are not binned by entropy (it does not say which tokens were drafts), only per draft position. There
each step is one point of the law: its acceptance over reached positions at the step's mean policy entropy
(`actor/entropy`, which the trainer logs on either backend). The law is linear, so its mean over a step's tokens is
its value at their mean entropy; the points' entropies are those of all the step's tokens, not of the reached
positions alone, an offset the fit and every later check share. Steps of one run seldom spread over much entropy,
so the fit phase's points set a slope only when they span a bin (0.25 nats); below, acceptance is taken as flat.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from bebop.entropy_law import EntropyFit, fit_entropy_law
from bebop.metrics import ENTROPY_BIN_EDGES, binned_acceptance, pool, positions

PREFIX = "draft_health/"
BIN_WIDTH = ENTROPY_BIN_EDGES[1] - ENTROPY_BIN_EDGES[0]  # nats


@dataclass(frozen=True)
class HealthConfig:
    fit_steps: int = 4  # RL steps with drafts that fit the law and set the reference
    z: float = 3.0  # interval half-width in standard errors: an alarm should mean something, not 1 step in 20

    def __post_init__(self) -> None:
        if isinstance(self.fit_steps, bool) or not isinstance(self.fit_steps, int) or self.fit_steps < 1:
            raise ValueError(f"fit_steps must be an int >= 1, got {self.fit_steps!r}")
        if not self.z > 0:
            raise ValueError(f"z must be > 0, got {self.z}")


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
        return "the draft no longer matches the policy (a stale or corrupt head?)"
    return "the draft matches the policy better than the law fitted on the first steps predicts (the law is stale)"


@dataclass(eq=False)
class DraftHealth:
    """Feed it each RL step's counters (`check`); it fits the law on the first steps, then flags residuals."""

    config: HealthConfig = field(default_factory=HealthConfig)
    fit: EntropyFit | None = None
    _early: list[dict] = field(default_factory=list)  # the fit phase's per-step counters
    _reference: tuple[float, float, float, float] = (math.nan, math.nan, math.nan, math.nan)  # α_0, H_0, H range
    _scatter: float = 0.0  # RMS residual of the fit phase's steps

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
        predicted = _predicted(self.fit, counters)
        residual = measured - predicted
        alpha_0, h_0, h_min, h_max = self._reference
        half = self.config.z * math.sqrt(measured * (1 - measured) / drafts + self._scatter ** 2)
        entropy_part = self.fit.slope * (entropy - h_0)
        out: dict[str, float | str] = {
            f"{PREFIX}measured": measured, f"{PREFIX}predicted": predicted, f"{PREFIX}residual": residual,
            f"{PREFIX}residual_lo": residual - half, f"{PREFIX}residual_hi": residual + half,
            f"{PREFIX}entropy_part": entropy_part, f"{PREFIX}mismatch_part": measured - alpha_0 - entropy_part,
            f"{PREFIX}alarm": float(abs(residual) > half)}
        if out[f"{PREFIX}alarm"]:
            outside = "" if h_min <= entropy <= h_max else (
                f"; the entropy {entropy:.2f} left the range the law was fitted on [{h_min:.2f}, {h_max:.2f}], so "
                "the law is extrapolated")
            out[f"{PREFIX}warning"] = (
                f"draft health: acceptance {measured:.3f} vs {predicted:.3f} predicted by the entropy law (residual "
                f"{residual:+.3f}, interval [{residual - half:+.3f}, {residual + half:+.3f}]); Eq.-16 mismatch term "
                f"{out[f'{PREFIX}mismatch_part']:+.3f}, entropy term {entropy_part:+.3f}: {_reading(residual)}{outside}")
        return out

    def _fit(self) -> None:
        binned = len(binned_acceptance(self._early[0])[2]) > 0
        if binned:  # the steps' bins pooled: a point per bin
            entropy, acceptance, reached = binned_acceptance(pool(self._early))
            spread = 1e-6
        else:  # a point per step, a slope only across a bin's width of entropy (module docstring)
            entropy, acceptance, reached = (torch.cat(column) for column in zip(*map(_points, self._early)))
            spread = BIN_WIDTH
        if int((reached > 0).sum()) >= 3 and float(entropy.max() - entropy.min()) > spread:
            self.fit = fit_entropy_law(entropy, acceptance, weights=reached, n_bootstrap=0)
        else:  # too little entropy spread for a slope: acceptance taken as flat in entropy
            mean = float((acceptance * reached).sum() / reached.sum())
            self.fit = EntropyFit(0.0, mean, math.nan, (math.nan, math.nan), len(entropy))
        # What the law leaves unexplained while the draft is healthy: the fit phase's own per-step residuals.
        residuals = [_acceptance(c)[0] - _predicted(self.fit, c) for c in self._early]
        dof = max(len(residuals) - 2, 1)
        self._scatter = math.sqrt(sum(r * r for r in residuals) / dof)
        total = float(reached.sum())
        alpha_0, h_0 = float((acceptance * reached).sum()) / total, float((entropy * reached).sum()) / total
        # The law covers the points it was fitted on, each the mean of a bin 0.25 nats wide (ENTROPY_BIN_EDGES) or of
        # a step's tokens: half a bin either side.
        self._reference = (alpha_0, h_0, float(entropy.min()) - BIN_WIDTH / 2, float(entropy.max()) + BIN_WIDTH / 2)
