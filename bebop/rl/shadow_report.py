"""A run's shadow stream read back (`bebop.rl.shadow`): per head and rule, the entropy law over the RL steps and how
far the acceptance drifted from start to end, with intervals. What notebooks 01 to 04, the dashboard and
docs/real-model-rl.md show.

    from bebop.rl.shadow_report import shadow_points, shadow_summary
    table = shadow_summary("runs/rl-heads")                 # one row per (head, rule)
    plots.acceptance_vs_entropy(shadow_points("runs/rl-heads"))             # the law, one series per head · rule
    plots.lines(shadow_points("runs/rl-heads"), ["acceptance"], title=..., y_title=...)   # acceptance over steps

The law (PAPER §3) is fitted with `bebop.entropy_law.fit_entropy_law`: `by="step"`, one point per RL step, the
step's accept length (or another per-step `value`) against its mean policy entropy at the drafted positions, as the
paper fits its RL runs; `by="bin"`, the token-level law, each entropy bin's acceptance α pooled over the whole run
(accepted / reached, weighted by reached positions). Start and end are the means of `value` over the first and the
last `window` steps (at most half the run each, so they never overlap; the issue's 10 by default), with 95%
percentile-bootstrap intervals over those steps: the steps are the independent draws (each its own prompts), the
positions within one are not. `change` is end - start and `relative_change` end / start - 1, bootstrapped the same
way (finding 4's "within ±5% of its start" reads off the latter).
"""

from __future__ import annotations

import math
import os

import pandas as pd
import torch

from bebop.entropy_law import EntropyFit, fit_entropy_law
from bebop.metrics import binned_acceptance, pool

KEYS = ["head", "rule", "strategy"]
VALUES = ("accept_length", "acceptance_rate")  # per-step values; `alpha_pos/{i}` too


def shadow_frame(run) -> pd.DataFrame:
    """The shadow stream of `run` (a run directory, a `bebop.runlog.Run`, or the stream's DataFrame itself)."""
    if isinstance(run, pd.DataFrame):
        frame = run
    else:
        if isinstance(run, (str, os.PathLike)):
            from bebop.runlog import load_run

            run = load_run(run)
        frame = run.streams.get("shadow")
        if frame is None or frame.empty:
            raise ValueError(f"run {getattr(run, 'path', '')} has no shadow stream: it ran without --shadow-heads")
    missing = [c for c in ["step", *KEYS, "entropy_mean"] if c not in frame.columns]
    if missing:
        raise ValueError(f"a shadow stream needs columns {missing}")
    return frame


def _series(frame: pd.DataFrame):
    """(head, rule, strategy, that series' rows in step order) for each series, in order of appearance."""
    for (head, rule), part in frame.groupby(["head", "rule"], sort=False):
        yield head, rule, str(part["strategy"].iloc[0]), part.sort_values("step")


def shadow_points(run, *, by: str = "step", value: str = "accept_length") -> pd.DataFrame:
    """The law's points, one series per head and rule: [run ("head · rule"), head, rule, strategy, step, entropy,
    acceptance, weight] (module docstring; `step` is NaN for pooled bins), what `plots.acceptance_vs_entropy`
    and `plots.lines` draw."""
    frame = shadow_frame(run)
    if by not in ("step", "bin"):
        raise ValueError(f"by must be 'step' or 'bin', got {by!r}")
    if by == "step" and value not in frame.columns:
        raise ValueError(f"the shadow stream has no per-step {value!r}; e.g. {list(VALUES)} or alpha_pos/0")
    parts = []
    for head, rule, strategy, part in _series(frame):
        if by == "step":
            points = pd.DataFrame({"step": part["step"].to_numpy(), "entropy": part["entropy_mean"].to_numpy(),
                                   "acceptance": part[value].to_numpy(dtype=float), "weight": 1.0})
        else:
            h, a, n = binned_acceptance(pool(part.to_dict("records")))
            points = pd.DataFrame({"step": math.nan, "entropy": h.numpy(), "acceptance": a.numpy(),
                                   "weight": n.numpy()})
        parts.append(points.dropna(subset=["entropy", "acceptance"]).assign(
            run=f"{head} · {rule}", head=head, rule=rule, strategy=strategy))
    columns = ["run", *KEYS, "step", "entropy", "acceptance", "weight"]
    return pd.concat(parts, ignore_index=True)[columns] if parts else pd.DataFrame(columns=columns)


def shadow_fits(run, *, by: str = "step", value: str = "accept_length", n_bootstrap: int = 1000,
                generator: torch.Generator | None = None) -> dict[tuple[str, str], EntropyFit | None]:
    """{(head, rule): the law's `EntropyFit`} (None where the points cannot fix a line), fitted as `shadow_summary`
    fits it (the same intervals): what `bebop.claims.Claims.law` decides a claim on."""
    points = shadow_points(run, by=by, value=value)
    return {(head, rule): _fit(part, n_bootstrap, _seeded(generator))
            for (head, rule), part in points.groupby(["head", "rule"], sort=False)}


def shadow_summary(run, *, by: str = "step", value: str = "accept_length", window: int = 10,
                   n_bootstrap: int = 1000, generator: torch.Generator | None = None) -> pd.DataFrame:
    """One row per (head, rule): strategy, points, slope, slope_lo, slope_hi, intercept, r2 (NaN where the points
    cannot fix a line: fewer than 3, or no spread in entropy), flags (what the points cannot support, in words: "" when
    nothing) and the fit a flag points to instead, within_slope, within_slope_lo, within_slope_hi, within_intercept,
    within_r2, within_points (`bebop.entropy_law.EntropyFit.within`; NaN and 0 when none), then start, end, change,
    relative_change (each with _lo / _hi), entropy_start, entropy_end and the window used. Without a generator each
    series bootstraps from seed 0, so its intervals are reproducible and do not depend on the other series."""
    if not (isinstance(window, int) and window >= 1):
        raise ValueError(f"window must be a positive int, got {window!r}")
    points = shadow_points(run, by=by, value=value)
    steps = shadow_points(run, by="step", value=value)
    rows = []
    for (head, rule), part in steps.groupby(["head", "rule"], sort=False):
        law = points[(points["head"] == head) & (points["rule"] == rule)]
        row = {"head": head, "rule": rule, "strategy": part["strategy"].iloc[0],
               **_law(law, n_bootstrap, _seeded(generator)),
               **_drift(part.sort_values("step"), window, n_bootstrap, _seeded(generator))}
        rows.append(row)
    return pd.DataFrame(rows)


LAW = ("slope", "slope_lo", "slope_hi", "intercept", "r2")


def _seeded(generator: torch.Generator | None) -> torch.Generator:
    """The generator given, else a fresh one seeded 0 for each use: a series' interval is then the same whichever
    series come before it, and the same as `plots.entropy_fits` draws for it."""
    return generator if generator is not None else torch.Generator().manual_seed(0)


def _law(points: pd.DataFrame, n_bootstrap: int, gen: torch.Generator) -> dict:
    """The law's columns: the fit, its flags in words (`EntropyFit.flags`, "" when none) and the within fit a flag
    points to (within_*: NaN when none)."""
    empty = {"points": len(points), **dict.fromkeys(LAW, math.nan), "flags": "", "within_points": 0,
             **{f"within_{key}": math.nan for key in LAW}}
    fit = _fit(points, n_bootstrap, gen)
    if fit is None:
        return empty
    out = {**empty, **_columns(fit, ""), "points": fit.n, "flags": "; ".join(fit.flags)}
    if fit.within is not None:
        out.update(_columns(fit.within, "within_"), within_points=fit.within.n)
    return out


def _fit(points: pd.DataFrame, n_bootstrap: int, gen: torch.Generator) -> EntropyFit | None:
    try:
        return fit_entropy_law(points["entropy"].to_numpy(dtype=float), points["acceptance"].to_numpy(dtype=float),
                               weights=points["weight"].to_numpy(dtype=float), n_bootstrap=n_bootstrap, generator=gen)
    except ValueError:  # too few points, or no spread in entropy: no line
        return None


def _columns(fit, prefix: str) -> dict:
    values = (fit.slope, *fit.slope_ci, fit.intercept, fit.r2)
    return {f"{prefix}{key}": value for key, value in zip(LAW, values)}


def _drift(part: pd.DataFrame, window: int, n_bootstrap: int, gen: torch.Generator) -> dict:
    """Start and end means of a series' per-step values, their change and relative change, with intervals."""
    values = torch.tensor(part["acceptance"].to_numpy(dtype=float), dtype=torch.float64)  # [S]
    entropy = part["entropy"].to_numpy(dtype=float)
    k = max(1, min(window, len(values) // 2))
    first, last = values[:k], values[-k:]
    boot_first, boot_last = _boot_means(first, n_bootstrap, gen), _boot_means(last, n_bootstrap, gen)  # [R] each
    out = {"window": k, "entropy_start": float(entropy[:k].mean()), "entropy_end": float(entropy[-k:].mean())}
    for name, centre, boot in (("start", first.mean(), boot_first), ("end", last.mean(), boot_last),
                               ("change", last.mean() - first.mean(), boot_last - boot_first),
                               ("relative_change", last.mean() / first.mean() - 1, boot_last / boot_first - 1)):
        lo, hi = _percentiles(boot)
        out.update({name: float(centre), f"{name}_lo": lo, f"{name}_hi": hi})
    return out


def _boot_means(values: torch.Tensor, n_bootstrap: int, gen: torch.Generator) -> torch.Tensor:
    """Means of `n_bootstrap` resamples (with replacement) of `values` [k] -> [R]; empty for one value or none asked."""
    if n_bootstrap <= 0 or len(values) < 2:
        return torch.empty(0, dtype=torch.float64)
    index = torch.randint(len(values), (n_bootstrap, len(values)), generator=gen)  # [R, k]
    return values[index].mean(-1)


def _percentiles(boot: torch.Tensor) -> tuple[float, float]:
    if boot.numel() == 0:
        return math.nan, math.nan
    lo, hi = torch.nanquantile(boot, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return lo, hi


def rule_slope_ratio(run, head: str = "rollout", *, value: str = "accept_length", n_bootstrap: int = 1000,
                     generator: torch.Generator | None = None) -> dict:
    """RS's slope over TO's for one head along the RL steps (finding 2: the paper's RS + TV keeps about 4% of TO's
    slope): {"rs_slope", "to_slope", "ratio", "ratio_lo", "ratio_hi", "steps", "entropy_min", "entropy_max"}
    (`paired_slopes` of the head's RS and TO series)."""
    got = paired_slopes(run, (head, "rs"), (head, "to"), value=value, n_bootstrap=n_bootstrap, generator=generator)
    return {"rs_slope": got["a_slope"], "to_slope": got["b_slope"],
            **{k: got[k] for k in ("ratio", "ratio_lo", "ratio_hi", "steps", "entropy_min", "entropy_max")}}


def paired_slopes(run, a: tuple[str, str], b: tuple[str, str], *, value: str = "accept_length",
                  n_bootstrap: int = 1000, generator: torch.Generator | None = None) -> dict:
    """Two (head, rule) series of one run's shadow stream, scored on the same rollouts, compared along the RL steps:
    {"a_slope", "b_slope", "ratio" (a's slope over b's), "slope_diff" (a - b), "level_diff" (the mean of a's `value`
    minus b's), each with "_lo" / "_hi", "steps", "entropy_min", "entropy_max"}. Each slope is the least-squares line
    of the step's `value` against its mean entropy (the law `by="step"` fits); the 95% intervals are a paired
    percentile bootstrap over the steps (one resample of steps for both series, as both were scored on the same
    rollouts). Finding 2 compares a head's RS and TO series; finding 3 two heads under RS."""
    frame = shadow_frame(run)
    rows = {(h, rule): part.set_index("step") for h, rule, _, part in _series(frame) if (h, rule) in (a, b)}
    for key in (a, b):
        if key not in rows:
            raise ValueError(f"head {key[0]!r} was not scored under {key[1].upper()} in this run's shadow stream")
    steps = sorted(set(rows[a].index) & set(rows[b].index))
    x = torch.tensor(rows[a].loc[steps, "entropy_mean"].to_numpy(dtype=float), dtype=torch.float64)  # [S] (shared)
    y = {k: torch.tensor(rows[k].loc[steps, value].to_numpy(dtype=float), dtype=torch.float64) for k in (a, b)}

    def slope(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:  # [..., S] -> [...]
        xc, yc = xs - xs.mean(-1, keepdim=True), ys - ys.mean(-1, keepdim=True)
        return (xc * yc).sum(-1) / (xc * xc).sum(-1)

    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    pick = torch.randint(len(steps), (n_bootstrap, len(steps)), generator=gen)  # [R, S]
    slopes = {k: slope(x[pick], y[k][pick]) for k in (a, b)}  # [R] each
    boots = {"ratio": slopes[a] / slopes[b], "slope_diff": slopes[a] - slopes[b],
             "level_diff": (y[a][pick] - y[b][pick]).mean(-1)}
    got = {"a_slope": float(slope(x, y[a])), "b_slope": float(slope(x, y[b]))}
    got.update(ratio=got["a_slope"] / got["b_slope"], slope_diff=got["a_slope"] - got["b_slope"],
               level_diff=float((y[a] - y[b]).mean()))
    for name, boot in boots.items():  # a resample whose b slope is 0 has no ratio
        got[f"{name}_lo"], got[f"{name}_hi"] = _percentiles(boot[torch.isfinite(boot)])
    return {**got, "steps": len(steps), "entropy_min": float(x.min()), "entropy_max": float(x.max())}
