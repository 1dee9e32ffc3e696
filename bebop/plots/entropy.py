"""Acceptance against entropy: the entropy-law points, fits and scatter."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from bebop import metrics
from bebop.entropy_law import SPARSE_SHARE
from bebop.plots.style import ACCEPT_LENGTH, check_columns, fill_colors, floats, apply_layout, run_names, has_spec, pooled, thin


def entropy_points(trains: Mapping[str, pd.DataFrame], *, by: str = "step") -> pd.DataFrame:
    """Points of the entropy law per run: [run, entropy, acceptance, weight, lo, hi].

    by="step": one point per RL step, accept length against the policy's mean entropy (PAPER Finding 1); lo / hi
    are NaN (a step is one draw). by="bin": token level, pooled over the whole run: acceptance rate of the drafts in
    each entropy bin against the bin's mean entropy, weighted by how many drafts reached that bin, with the rate's
    95% interval over them (`bin_intervals`).
    """
    if by not in ("step", "bin"):
        raise ValueError(f"by must be 'step' or 'bin', got {by!r}")
    frames = []
    for run, train in trains.items():
        if by == "step":
            if not {ACCEPT_LENGTH, "actor/entropy"} <= set(train.columns):
                continue
            part = pd.DataFrame({"entropy": train["actor/entropy"], "acceptance": train[ACCEPT_LENGTH],
                                 "weight": 1.0}).dropna().assign(lo=math.nan, hi=math.nan)
        else:
            if not has_spec(train):
                continue
            h, a, n = metrics.binned_acceptance(pooled(train))
            part = bin_intervals(pd.DataFrame({"entropy": h.numpy(), "acceptance": a.numpy(), "weight": n.numpy()}))
        frames.append(part.assign(run=run)[POINT_COLUMNS])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=POINT_COLUMNS)


POINT_COLUMNS = ["run", "entropy", "acceptance", "weight", "lo", "hi"]


def bin_intervals(points: pd.DataFrame) -> pd.DataFrame:
    """Binned points (acceptance rates over `weight` reached drafts) with their 95% Wilson interval as lo / hi
    (`bebop.metrics.rate_interval`: draft tokens of one verify step are correlated, so the truth is wider)."""
    bounds = [metrics.rate_interval(a * n, n) for a, n in zip(points["acceptance"], points["weight"])]
    return points.dropna(subset=["entropy", "acceptance"]).assign(
        lo=[b[0] for b in bounds] or math.nan, hi=[b[1] for b in bounds] or math.nan)


def token_points(tokens: Mapping[str, pd.DataFrame],
                 edges: Sequence[float] = metrics.ENTROPY_BIN_EDGES) -> pd.DataFrame:
    """The token-level law of evaluation runs (`tokens` streams: entropy, accepted 0/1 per reached draft).

    One series per run and (head, method) when those columns exist ("run · head method"), pooled over
    the rest (temperatures included: the entropy axis already tells them apart), one point per entropy bin, with its
    interval (`bin_intervals`).
    """
    frames = []
    for run, frame in tokens.items():
        if not {"entropy", "accepted"} <= set(frame.columns) or frame.empty:
            continue
        keys = [c for c in ("head", "method") if c in frame.columns]
        data = frame[[*keys, "entropy", "accepted"]].dropna()
        data = data.assign(bin=np.digitize(data["entropy"].to_numpy(dtype=float), np.asarray(edges[1:-1])))
        table = data.groupby([*keys, "bin"]).agg(entropy=("entropy", "mean"), acceptance=("accepted", "mean"),
                                                 weight=("accepted", "size")).reset_index()
        label = table[keys].astype(str).agg(" ".join, axis=1) if keys else pd.Series("", index=table.index)
        table["run"] = [f"{run} · {x}" if x else run for x in label]
        frames.append(bin_intervals(table)[POINT_COLUMNS])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=POINT_COLUMNS)


FIT_COLUMNS = ["run", "slope", "slope_lo", "slope_hi", "intercept", "r2", "n", "flags", "within_slope",
               "within_lo", "within_hi", "within_r2", "within_n", "within_from", "within_to"]


def entropy_fits(points: pd.DataFrame, *, n_bootstrap: int = 1000) -> pd.DataFrame:
    """The fitted law acceptance = intercept + slope·H per run (`bebop.entropy_law.fit_entropy_law`): [run, slope,
    slope_lo, slope_hi (its 95% bootstrap interval), intercept, r2, n, flags (what the points cannot support, in
    words; "" when nothing), within_* (the fit a flag points to: slope, interval, R², points and the entropies it
    covers; NaN when none)]. NaN slopes: no fit (fewer than 3 points, or no spread in entropy yet)."""
    check_columns(points, ("run", "entropy", "acceptance", "weight"), "entropy_fits")
    rows = []
    for run in run_names(points):
        part = points[points["run"] == run]
        row = dict.fromkeys(FIT_COLUMNS, math.nan) | {"run": run, "n": len(part), "flags": "", "within_n": 0}
        try:
            fit = metrics.fit_entropy_law(floats(part["entropy"]), floats(part["acceptance"]),
                                          weights=floats(part["weight"]), n_bootstrap=n_bootstrap)
        except ValueError:
            rows.append(row)
            continue
        row.update(slope=fit.slope, slope_lo=fit.slope_ci[0], slope_hi=fit.slope_ci[1], intercept=fit.intercept,
                   r2=fit.r2, n=fit.n, flags="; ".join(fit.flags))
        if fit.within is not None:
            w = fit.within
            row.update(within_slope=w.slope, within_lo=w.slope_ci[0], within_hi=w.slope_ci[1], within_r2=w.r2,
                       within_n=w.n, within_from=w.span[0], within_to=w.span[1],
                       within_intercept=w.intercept)
        rows.append(row)
    return pd.DataFrame(rows, columns=[*FIT_COLUMNS, "within_intercept"])


def law_label(fit: Mapping) -> str:
    """A fit's legend text: slope [95% interval] per nat, R², points, and for a flagged fit the slope it points to."""
    if math.isnan(fit["slope"]):
        return "too few points to fit"
    ci = "" if math.isnan(fit["slope_lo"]) else f" [{fit['slope_lo']:+.2f}, {fit['slope_hi']:+.2f}]"
    text = f"slope {fit['slope']:+.2f}{ci}/nat, R² {fit['r2']:.2f}, {int(fit['n'])} points"
    if fit["flags"]:
        within = "" if math.isnan(fit["within_slope"]) else f": {fit['within_slope']:+.2f} within (dashed)"
        text += f" ⚠ flagged{within}"
    return text


def fitted_span(intercept: float, slope: float, low: float, high: float) -> np.ndarray:
    """The entropies [2] over which to draw a fitted line: the points' range, cut where the line reaches 0.

    Acceptance (a rate, or an accept length) is never negative, so a steep fit over widely spread bins is drawn
    only where it still says something possible.
    """
    if slope < 0:
        high = min(high, max(low, -intercept / slope))
    elif slope > 0:
        low = max(low, min(high, -intercept / slope))
    return np.array([low, high], dtype=float)


def acceptance_vs_entropy(points: pd.DataFrame, *, colors: Mapping[str, str] | None = None,
                          y_title: str = "accept length (tokens / verify step)") -> go.Figure:
    """Scatter per run with its fitted line; the legend gives slope [95% interval] per nat, R², the points fitted and,
    for a flagged fit (`entropy_fits`' flags), the slope within the main cluster (or without the point that sets the
    line), drawn dashed over the entropies it covers. Binned points are sized by their drafts, with their interval;
    nearly empty bins (under `bebop.entropy_law.SPARSE_SHARE` of the drafts) are drawn hollow."""
    fits = entropy_fits(points).set_index("run")
    colors = fill_colors(run_names(points), colors)
    fig = go.Figure()
    for run in run_names(points):
        part = points[points["run"] == run]
        keep = thin(len(part))
        weight = part["weight"].to_numpy(dtype=float)
        binned = np.ptp(weight) > 0
        # Binned points are sized by how many drafts they pool; per-step points all weigh the same.
        size = 4 + 14 * np.sqrt(weight / weight.max()) if binned else np.full(len(part), 7.0)
        sparse = binned & (weight < SPARSE_SHARE * weight.sum())
        fit = fits.loc[run]
        law = law_label(fit)
        error = {}
        if {"lo", "hi"} <= set(part.columns) and part["lo"].notna().any():
            y = part["acceptance"].to_numpy(dtype=float)
            error = dict(error_y=dict(type="data", symmetric=False, array=(part["hi"].to_numpy(dtype=float) - y)[keep],
                                      arrayminus=(y - part["lo"].to_numpy(dtype=float))[keep], thickness=1, width=0,
                                      color=colors[run]))
        fig.add_trace(go.Scatter(
            x=part["entropy"].to_numpy()[keep], y=part["acceptance"].to_numpy()[keep], mode="markers",
            name=f"{run} · {law}", legendgroup=run, **error,
            marker=dict(color=colors[run], size=size[keep], opacity=0.75, line=dict(width=1.5, color=colors[run]),
                        symbol=np.where(sparse, "circle-open", "circle")[keep]),
            customdata=weight[keep], text=np.where(sparse, " (nearly empty)", "")[keep],
            hovertemplate=f"<b>{html.escape(run)}</b><br>H %{{x:.3f}} nats<br>acceptance %{{y:.3f}}<br>weight "
                          "%{customdata:.0f}%{text}<extra></extra>",
        ))
        if math.isnan(fit["slope"]):
            continue
        x = fitted_span(fit["intercept"], fit["slope"], part["entropy"].min(), part["entropy"].max())
        fig.add_trace(go.Scatter(
            x=x, y=fit["intercept"] + fit["slope"] * x, mode="lines", legendgroup=run, showlegend=False,
            name=f"{run} fit", line=dict(color=colors[run], width=2.5),
            hovertemplate=f"{html.escape(run)}: {law}<extra></extra>",
        ))
        if not math.isnan(fit["within_slope"]):
            x = fitted_span(fit["within_intercept"], fit["within_slope"], fit["within_from"], fit["within_to"])
            fig.add_trace(go.Scatter(
                x=x, y=fit["within_intercept"] + fit["within_slope"] * x, mode="lines", legendgroup=run,
                showlegend=False, name=f"{run} within", line=dict(color=colors[run], width=2, dash="dash"),
                hovertemplate=f"{html.escape(run)} within: {fit['within_slope']:+.2f}/nat, R² "
                              f"{fit['within_r2']:.2f}, {int(fit['within_n'])} points<extra></extra>"))
    fig.update_yaxes(rangemode="tozero")  # acceptance from 0: a spread of 0.01 must not fill the chart like a trend
    fig.update_xaxes(rangemode="tozero")
    return apply_layout(fig, "Acceptance vs entropy", "policy entropy H(p) (nats)", y_title, height=460)
