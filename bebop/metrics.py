"""Speculative-decoding metrics: counters, pooled rates, the entropy law and the speedup bound.

Speculative runs are logged as *counters* (drafts, drafted tokens, accepted tokens, per position and per
entropy bin) and rates are derived only when read. A ratio of sums is the only honest pooled rate: the mean
of per-step ratios over-weights small steps (one row accepting 3/3 and three rows accepting 0/3 pool to
0.25, not 0.5). The flat names follow vLLM (`spec/num_drafts`, ...) so its users read them as they expect.

Per verify step with depth γ, a draft of row b reaches positions 0..min(n_b, γ-1) (every position up to and
including the first rejection) and has positions 0..n_b-1 accepted, where n_b = num_accepted[b]. So
    acceptance rate    = accepted / (drafts·γ)           accept length = 1 + accepted / drafts
    acceptance_rate_pos/i = accepted at i / drafts       (vLLM; unconditional)
    alpha_pos/i          = accepted at i / reached i     (PAPER α_i, conditional on the earlier steps)
and since a draft reaches i exactly when it accepted i-1, `reached_per_pos` is derived, never stored.
Entropy bins hold reached positions only: an unreached draft was never tested, so it says nothing about α.

A rate's 95% interval is `rate_interval`, a difference's `rate_difference_interval`. The rest is analysis on
those numbers: H(p), the RS-vs-TO decision boundary d_TV(p, q) < 1 - p(argmax q), and the speedup bound
(1 + Σ_j Π_{i≤j} α_i) / (verify + γ·draft cost). The entropy-law fit and the Eq.-16 decomposition live
in `bebop.entropy_law` and are re-exported here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

# Re-exported: the entropy law is part of the metrics API (notebooks and eval-mtp import it from here).
from bebop.entropy_law import Decomposition, EntropyFit, decompose_acceptance, fit_entropy_law  # noqa: F401

# Policy entropies during RL sit around 0.1-0.6 nats (PAPER §3), so the bins are fine there; the last bin
# collects everything above 3 nats. Edges are in nats; bin k holds H in [edges[k], edges[k+1]).
ENTROPY_BIN_EDGES: tuple[float, ...] = tuple(0.25 * k for k in range(13)) + (math.inf,)

_COUNTER_KEY = re.compile(
    r"spec/(num_drafts|num_draft_tokens|num_accepted_tokens|num_accepted_tokens_per_pos/\d+"
    r"|num_reached_tokens_per_pos/\d+"
    r"|by_entropy/\d+/(num_draft_tokens|num_accepted_tokens|entropy_sum))"
)
_BIN_KEY = re.compile(r"spec/by_entropy/(\d+)/num_draft_tokens")


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else math.nan


# ---- Counters ------------------------------------------------------------------------------------------
@dataclass(eq=False)
class SpecCounters:
    """Running speculative-decoding counters for one (γ, method), accumulated on the update's device.

    `update` launches a few kernels and never waits on the device (unless `validate=True` checks values),
    so it can sit in an engine's hot loop; each counter property costs one device->host transfer.
    """

    gamma: int
    method: str = "rs"
    entropy_bin_edges: tuple[float, ...] = ENTROPY_BIN_EDGES
    # float64 is exact for counts below 2^53. Layout: [drafts, draft tokens, accepted_per_pos[γ],
    # bin reached[nb], bin accepted[nb], bin entropy sum[nb]].
    _totals: Tensor = field(init=False, repr=False)
    _constants: dict = field(init=False, repr=False)  # (device, dtype) -> (inner bin edges, positions)

    def __post_init__(self) -> None:
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int) or self.gamma < 1:
            raise ValueError(f"gamma must be an int >= 1, got {self.gamma!r}")
        if not isinstance(self.method, str) or not self.method or "/" in self.method:
            raise ValueError(f"method must be a non-empty name without '/', got {self.method!r}")
        edges = tuple(float(e) for e in self.entropy_bin_edges)
        increasing = all(a < b for a, b in zip(edges, edges[1:]))
        if len(edges) < 2 or edges[0] != 0.0 or edges[-1] != math.inf or not increasing:
            raise ValueError(f"entropy_bin_edges must increase strictly from 0 to inf, got {edges}")
        self.entropy_bin_edges = edges
        self._totals = torch.zeros(2 + self.gamma + 3 * self.num_bins, dtype=torch.float64)
        self._constants = {}

    @property
    def num_bins(self) -> int:
        return len(self.entropy_bin_edges) - 1

    def update(self, num_accepted: Tensor, draft_entropy: Tensor, *, validate: bool = True) -> None:
        """Count one verify step. num_accepted [B] int in 0..γ; draft_entropy [B, γ] = H(p_i) at draft i.

        validate=True checks values too (one host sync); shapes and dtypes are always checked.
        """
        g, nb = self.gamma, self.num_bins
        if draft_entropy.dim() != 2 or draft_entropy.shape[1] != g or not draft_entropy.is_floating_point():
            raise ValueError(f"draft_entropy must be a float [B, gamma={g}] tensor, got "
                             f"{draft_entropy.dtype} {tuple(draft_entropy.shape)}")
        integer = not num_accepted.is_floating_point() and num_accepted.dtype != torch.bool
        if num_accepted.shape != draft_entropy.shape[:1] or not integer:
            raise ValueError(f"num_accepted must be an integer [B={draft_entropy.shape[0]}] tensor, got "
                             f"{num_accepted.dtype} {tuple(num_accepted.shape)}")
        if validate:
            bad_n = ((num_accepted < 0) | (num_accepted > g)).any().cpu()
            bad_h = (~torch.isfinite(draft_entropy) | (draft_entropy < -1e-4)).any().cpu()
            bad_n, bad_h = torch.stack([bad_n, bad_h]).tolist()  # one sync for both checks
            if bad_n:
                raise ValueError(f"num_accepted must lie in 0..gamma={g}, got {num_accepted.tolist()}")
            if bad_h:
                raise ValueError("draft_entropy must be finite and non-negative (nats)")
        device, dtype = draft_entropy.device, torch.promote_types(draft_entropy.dtype, torch.float32)
        if self._totals.device != device:
            self._totals = self._totals.to(device)
        if (device, dtype) not in self._constants:
            inner = torch.tensor(self.entropy_bin_edges[1:-1], dtype=dtype, device=device)
            self._constants[device, dtype] = inner, torch.arange(g, dtype=dtype, device=device)
        inner_edges, position = self._constants[device, dtype]  # [nb-1], [γ]
        # Float arithmetic instead of bool masks: fewer kernels, and per-step counts are exact in float32.
        n = num_accepted.to(device=device, dtype=dtype)[:, None]  # [B, 1]
        accepted = (n - position).clamp_(0, 1)  # [B, γ]  1 where i < n
        reached = (n + 1 - position).clamp_(0, 1)  # [B, γ]  1 where i <= n: up to and including the rejection
        h = draft_entropy.to(dtype).contiguous()  # [B, γ] (bucketize copies non-contiguous input anyway)
        bins = torch.bucketize(h, inner_edges, right=True)  # [B, γ] in 0..nb-1
        source = torch.stack([reached, accepted, h * reached], -1).reshape(-1, 3)  # [B·γ, 3]
        per_bin = torch.zeros(nb, 3, dtype=dtype, device=device).index_add_(0, bins.reshape(-1), source)  # [nb, 3]
        drafts = reached[:, 0].sum(0, keepdim=True)  # [1]  every draft reaches position 0
        self._totals += torch.cat([drafts, drafts * g, accepted.sum(0), per_bin.T.reshape(-1)])  # float64 totals

    def _keys(self) -> list[str]:
        """Counter names in the order of `_totals`: the one place that defines its layout."""
        per_pos = [f"spec/num_accepted_tokens_per_pos/{i}" for i in range(self.gamma)]
        names = ("num_draft_tokens", "num_accepted_tokens", "entropy_sum")
        per_bin = [f"spec/by_entropy/{k}/{name}" for name in names for k in range(self.num_bins)]
        return ["spec/num_drafts", "spec/num_draft_tokens", *per_pos, *per_bin]

    def _column(self, pattern: str, n: int) -> list:
        counts = self.to_dict()
        return [counts[pattern.format(i)] for i in range(n)]

    @property
    def num_drafts(self) -> int:
        return self.to_dict()["spec/num_drafts"]

    @property
    def num_draft_tokens(self) -> int:
        return self.to_dict()["spec/num_draft_tokens"]

    @property
    def num_accepted_tokens(self) -> int:
        return self.to_dict()["spec/num_accepted_tokens"]

    @property
    def accepted_per_pos(self) -> list[int]:
        return self._column("spec/num_accepted_tokens_per_pos/{}", self.gamma)

    @property
    def reached_per_pos(self) -> list[int]:
        return [self.num_drafts, *self.accepted_per_pos[:-1]]

    @property
    def bin_num_draft_tokens(self) -> list[int]:
        return self._column("spec/by_entropy/{}/num_draft_tokens", self.num_bins)

    @property
    def bin_num_accepted_tokens(self) -> list[int]:
        return self._column("spec/by_entropy/{}/num_accepted_tokens", self.num_bins)

    @property
    def bin_entropy_sum(self) -> list[float]:
        return self._column("spec/by_entropy/{}/entropy_sum", self.num_bins)

    def merge(self, other: SpecCounters) -> SpecCounters:
        """Add `other`'s counts into these (in place) and return self."""
        if not isinstance(other, SpecCounters):
            raise ValueError(f"can only merge SpecCounters, got {type(other).__name__}")
        mine = (self.gamma, self.method, self.entropy_bin_edges)
        theirs = (other.gamma, other.method, other.entropy_bin_edges)
        if mine != theirs:
            raise ValueError(f"cannot merge counters of different (gamma, method, bin edges): {mine} vs {theirs}")
        self._totals += other._totals.to(self._totals.device)
        return self

    def __add__(self, other: SpecCounters) -> SpecCounters:
        total = SpecCounters(self.gamma, self.method, self.entropy_bin_edges)
        total._totals = self._totals.clone()
        return total.merge(other)

    def to_dict(self) -> dict[str, float | int | str]:
        """Flat counters under the DESIGN.md names; bins are indexed, their edges belong in the run's meta."""
        g = self.gamma
        out: dict[str, float | int | str] = {"spec/gamma": g, "spec/method": self.method}
        for key, value in zip(self._keys(), self._totals.tolist()):
            out[key] = value if key.endswith("entropy_sum") else round(value)
        out["spec/num_accepted_tokens"] = sum(out[f"spec/num_accepted_tokens_per_pos/{i}"] for i in range(g))
        return out

    @classmethod
    def from_dict(cls, counters: Mapping, *, entropy_bin_edges: Sequence[float] = ENTROPY_BIN_EDGES,
                  ) -> SpecCounters:
        """Rebuild counters from `to_dict` output (or a `pool` of many); every counter key must be present."""
        for key in ("spec/gamma", "spec/method"):
            if key not in counters:
                raise ValueError(f"counters has no {key!r}")
        out = cls(int(counters["spec/gamma"]), str(counters["spec/method"]), tuple(entropy_bin_edges))
        keys = out._keys()
        missing = [key for key in keys if key not in counters]
        if missing:
            raise ValueError(f"counters lacks {len(missing)} keys for gamma={out.gamma}, {out.num_bins} bins, "
                             f"e.g. {missing[:3]}")
        if f"spec/by_entropy/{out.num_bins}/num_draft_tokens" in counters:
            raise ValueError(f"counters has more than {out.num_bins} entropy bins: pass the run's bin edges")
        out._totals = torch.tensor([float(counters[key]) for key in keys], dtype=torch.float64)
        total = counters.get("spec/num_accepted_tokens")
        if total is not None and round(float(total)) != out.num_accepted_tokens:
            raise ValueError("spec/num_accepted_tokens differs from the sum of spec/num_accepted_tokens_per_pos")
        return out


# ---- Intervals on a rate -------------------------------------------------------------------------------
def rate_interval(successes: float, trials: float, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of successes / trials (95% at z = 1.96); (nan, nan) over no trials.

    Wilson rather than p ± z·SE because acceptance sits near 0 or 1 where the latter leaves [0, 1]. It treats the
    trials as independent: draft tokens of one verify step are not (after a rejection the rest go untested), so
    over draft tokens it is narrower than the truth: a lower bound on the uncertainty."""
    if trials <= 0:
        return math.nan, math.nan
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)  # exact Wilson bounds lie in [0, 1]; rounding may not


def rate_difference_interval(k1: float, n1: float, k2: float, n2: float, z: float = 1.96) -> tuple[float, float]:
    """Interval of k1/n1 - k2/n2 from the two Wilson intervals (Newcombe's hybrid score method, 95% at z = 1.96);
    a difference whose interval holds 0 is inside the noise. Independent samples assumed, as in `rate_interval`."""
    (l1, u1), (l2, u2) = rate_interval(k1, n1, z), rate_interval(k2, n2, z)
    p1, p2 = _ratio(k1, n1), _ratio(k2, n2)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


# ---- Pooled rates --------------------------------------------------------------------------------------
ENGINE_COUNTERS = ("engine/num_steps", "engine/draft_s", "engine/verify_s", "engine/advance_s")


def engine_step_costs(counters: Mapping) -> dict[str, float] | None:
    """Seconds per engine step from the engine's summed `engine/*` counters (a rollout's stats, or a run's records
    summed): {"num_steps", "draft_s" (the γ draft steps), "verify_s" (the target forward and the catch-up after it:
    all a plain decode step does)}. None when the counters are missing or no step ran."""
    if not all(key in counters for key in ENGINE_COUNTERS):
        return None
    steps = float(counters["engine/num_steps"])
    if steps <= 0:
        return None
    return {"num_steps": steps, "draft_s": float(counters["engine/draft_s"]) / steps,
            "verify_s": float(counters["engine/verify_s"] + counters["engine/advance_s"]) / steps}


def pool(records: Iterable[Mapping]) -> dict[str, float | int | str]:
    """Sum the speculative counters of many records (steps, rollouts, workers) into one counter dict.

    Other keys are ignored, and so are missing or NaN values (pandas fills absent columns with NaN).
    Records that disagree on spec/gamma or spec/method cannot be pooled: ValueError.
    """
    total: dict[str, float | int | str] = {}
    for record in records:
        for key in ("spec/gamma", "spec/method"):
            value = record.get(key)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            value = int(value) if key == "spec/gamma" else str(value)
            if total.setdefault(key, value) != value:
                raise ValueError(f"cannot pool records with different {key}: {total[key]!r} vs {value!r}")
        for key, value in record.items():
            if _COUNTER_KEY.fullmatch(key) and value is not None and not math.isnan(float(value)):
                total[key] = total.get(key, 0) + value
    return total


def positions(counters: Mapping) -> list[tuple[float, float]]:
    """(reached, accepted) drafts per draft position [γ] (NaN accepted where a position has no count). A draft reaches
    position i + 1 exactly when it accepted i; steps of different depths (gamma="auto") store the reached counts, as
    not every draft that accepted i - 1 drafted i there (`bebop.engine.rollout.pool_depths`)."""
    out, reached = [], float(counters["spec/num_drafts"])
    for i in range(int(counters["spec/gamma"])):
        accepted = float(counters.get(f"spec/num_accepted_tokens_per_pos/{i}", math.nan))
        reached = float(counters.get(f"spec/num_reached_tokens_per_pos/{i}", reached))
        out.append((reached, accepted))
        reached = accepted
    return out


def derive(counters: Mapping) -> dict[str, float]:
    """Rates from (pooled) counters; a rate over zero events is NaN. Needs spec/gamma and spec/num_drafts."""
    for key in ("spec/gamma", "spec/num_drafts", "spec/num_draft_tokens", "spec/num_accepted_tokens"):
        if key not in counters:
            raise ValueError(f"counters has no {key!r}: pass SpecCounters.to_dict() or pool(...) output")
    gamma, drafts = int(counters["spec/gamma"]), float(counters["spec/num_drafts"])
    accepted = float(counters["spec/num_accepted_tokens"])
    out = {"spec/acceptance_rate": _ratio(accepted, float(counters["spec/num_draft_tokens"])),
           "spec/accept_length": 1.0 + accepted / drafts if drafts > 0 else math.nan}
    for i, (reached, at_i) in enumerate(positions(counters)):
        out[f"spec/acceptance_rate_pos/{i}"] = _ratio(at_i, drafts)
        out[f"spec/alpha_pos/{i}"] = _ratio(at_i, reached)
    rows = _bins(counters)
    for k, reached, accepted_k, entropy_sum in rows:
        out[f"spec/by_entropy/{k}/acceptance_rate"] = _ratio(accepted_k, reached)
        out[f"spec/by_entropy/{k}/entropy_mean"] = _ratio(entropy_sum, reached)
    if rows:
        out["spec/entropy_mean"] = _ratio(sum(row[3] for row in rows), sum(row[1] for row in rows))
    return out


def _bins(counters: Mapping) -> list[tuple[int, float, float, float]]:
    """(bin, reached, accepted, entropy sum) for every entropy bin in a counter dict."""
    bins = sorted(int(m.group(1)) for key in counters if (m := _BIN_KEY.fullmatch(key)))
    names = ("num_draft_tokens", "num_accepted_tokens", "entropy_sum")
    return [(k, *(float(counters[f"spec/by_entropy/{k}/{name}"]) for name in names)) for k in bins]


def binned_acceptance(counters: Mapping) -> tuple[Tensor, Tensor, Tensor]:
    """The entropy-law points of non-empty bins: mean H of reached positions, acceptance = accepted / reached,
    and the reached count to use as the fit's weight; each float64 [bins]."""
    rows = [(h / n, a / n, n) for _, n, a, h in _bins(counters) if n > 0]
    table = torch.tensor(rows, dtype=torch.float64).reshape(-1, 3)  # [bins, 3]
    return table[:, 0], table[:, 1], table[:, 2]


# ---- RS vs TO, and the speedup bound -------------------------------------------------------------------
def _check_pair(target_probs: Tensor, draft_probs: Tensor) -> None:
    if target_probs.shape != draft_probs.shape or target_probs.dim() < 1:
        raise ValueError(f"target_probs {tuple(target_probs.shape)} and draft_probs {tuple(draft_probs.shape)} "
                         "must share one shape [..., V]")
    for name, p in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        ok = p.is_floating_point() and not bool((p < 0).any())
        if not ok or not torch.allclose(p.sum(-1), torch.ones(()).to(p), atol=1e-3):
            raise ValueError(f"{name} must be non-negative float distributions summing to 1 over the last dim")


def alpha_rs(target_probs: Tensor, draft_probs: Tensor) -> Tensor:
    """Rejection-sampling acceptance 1 - d_TV(p, q) = 1 - 0.5·Σ|p - q|: [..., V] -> [...]."""
    _check_pair(target_probs, draft_probs)
    return 1.0 - 0.5 * (target_probs - draft_probs).abs().sum(-1)


def alpha_to(target_probs: Tensor, draft_probs: Tensor) -> Tensor:
    """Target-only acceptance p(argmax q): [..., V] -> [...]."""
    _check_pair(target_probs, draft_probs)
    return target_probs.gather(-1, draft_probs.argmax(-1, keepdim=True))[..., 0]


def rs_beats_to(target_probs: Tensor, draft_probs: Tensor) -> Tensor:
    """Where RS accepts more than TO: d_TV(p, q) < 1 - p(argmax q). [..., V] -> bool [...]; ties go to TO."""
    return alpha_rs(target_probs, draft_probs) > alpha_to(target_probs, draft_probs)


def expected_tokens_per_step(alpha: float | Sequence[float], gamma: int) -> float:
    """Tokens per verify step, 1 + Σ_{j=1..γ} Π_{i≤j} α_i; a scalar α means the same α at every depth."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an int >= 1, got {gamma!r}")
    values = torch.as_tensor(alpha, dtype=torch.float64)
    alphas = values.expand(gamma).tolist() if values.dim() == 0 else values.reshape(-1).tolist()
    if len(alphas) != gamma:
        raise ValueError(f"alpha has {len(alphas)} entries, expected gamma={gamma}")
    if not all(0.0 <= a <= 1.0 for a in alphas):
        raise ValueError(f"every alpha must lie in [0, 1], got {alphas}")
    tokens, survive = 1.0, 1.0
    for a in alphas:
        survive *= a
        tokens += survive
    return tokens


def theoretical_speedup(alpha: float | Sequence[float], gamma: int, *, draft_cost: float,
                        verify_cost: float = 1.0) -> float:
    """Tokens per unit time relative to plain decoding (1 token per step of cost 1.0).

    draft_cost is one draft step and verify_cost one (γ+1)-token target forward, both in units of a plain
    1-token decode step. draft_cost = 0 gives the free-draft upper bound.
    """
    if not draft_cost >= 0:
        raise ValueError(f"draft_cost must be >= 0, got {draft_cost}")
    if not verify_cost > 0:
        raise ValueError(f"verify_cost must be > 0, got {verify_cost}")
    return expected_tokens_per_step(alpha, gamma) / (verify_cost + gamma * draft_cost)
