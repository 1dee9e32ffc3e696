"""Acceptance against entropy: the entropy-law points, fits and scatter."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from bebop import metrics
from bebop.plots.style import ACCEPT_LENGTH, check_columns, fill_colors, floats, apply_layout, run_names, has_spec, pooled, thin


def entropy_points(trains: Mapping[str, pd.DataFrame], *, by: str = "step") -> pd.DataFrame:
    """Points of the entropy law per run: [run, entropy, acceptance, weight].

    by="step": one point per RL step, accept length against the policy's mean entropy (PAPER Finding 1).
    by="bin": token level, pooled over the whole run: acceptance rate of the drafts in each entropy bin
    against the bin's mean entropy, weighted by how many drafts reached that bin.
    """
    if by not in ("step", "bin"):
        raise ValueError(f"by must be 'step' or 'bin', got {by!r}")
    frames = []
    for run, train in trains.items():
        if by == "step":
            if not {ACCEPT_LENGTH, "actor/entropy"} <= set(train.columns):
                continue
            part = pd.DataFrame({"entropy": train["actor/entropy"], "acceptance": train[ACCEPT_LENGTH],
                                 "weight": 1.0})
        else:
            if not has_spec(train):
                continue
            h, a, n = metrics.binned_acceptance(pooled(train))
            part = pd.DataFrame({"entropy": h.numpy(), "acceptance": a.numpy(), "weight": n.numpy()})
        part = part.dropna()
        frames.append(part.assign(run=run)[["run", "entropy", "acceptance", "weight"]])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["run", "entropy", "acceptance", "weight"])


def token_points(tokens: Mapping[str, pd.DataFrame],
                 edges: Sequence[float] = metrics.ENTROPY_BIN_EDGES) -> pd.DataFrame:
    """The token-level law of evaluation runs (`tokens` streams: entropy, accepted 0/1 per reached draft).

    One series per run and (head, method) when those columns exist ("run · head method"), pooled over
    the rest (temperatures included: the entropy axis already tells them apart), one point per entropy bin.
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
        frames.append(table[["run", "entropy", "acceptance", "weight"]])
    columns = ["run", "entropy", "acceptance", "weight"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def entropy_fits(points: pd.DataFrame) -> pd.DataFrame:
    """The fitted law acceptance = intercept + slope·H per run: [run, slope, intercept, r2, n] (NaN: no fit)."""
    check_columns(points, ("run", "entropy", "acceptance", "weight"), "entropy_fits")
    rows = []
    for run in run_names(points):
        part = points[points["run"] == run]
        try:
            fit = metrics.fit_entropy_law(floats(part["entropy"]), floats(part["acceptance"]),
                                          weights=floats(part["weight"]), n_bootstrap=0)
            rows.append((run, fit.slope, fit.intercept, fit.r2, fit.n))
        except ValueError:  # fewer than 3 points, or no spread in entropy yet
            rows.append((run, math.nan, math.nan, math.nan, len(part)))
    return pd.DataFrame(rows, columns=["run", "slope", "intercept", "r2", "n"])


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
    """Scatter per run with its fitted line; the legend gives slope (per nat), R² and the points fitted."""
    fits = entropy_fits(points).set_index("run")
    colors = fill_colors(run_names(points), colors)
    fig = go.Figure()
    for run in run_names(points):
        part = points[points["run"] == run]
        keep = thin(len(part))
        weight = part["weight"].to_numpy(dtype=float)
        # Binned points are sized by how many drafts they pool; per-step points all weigh the same.
        size = 4 + 14 * np.sqrt(weight / weight.max()) if np.ptp(weight) > 0 else np.full(len(part), 7.0)
        fit = fits.loc[run]
        law = "too few points to fit" if math.isnan(fit["slope"]) else \
            f"slope {fit['slope']:+.2f}/nat, R² {fit['r2']:.2f}, {int(fit['n'])} points"
        fig.add_trace(go.Scatter(
            x=part["entropy"].to_numpy()[keep], y=part["acceptance"].to_numpy()[keep], mode="markers",
            name=f"{run} · {law}", legendgroup=run, marker=dict(color=colors[run], size=size[keep], opacity=0.75, line=dict(width=0)),
            customdata=part["weight"].to_numpy()[keep],
            hovertemplate=f"<b>{html.escape(run)}</b><br>H %{{x:.3f}} nats<br>acceptance %{{y:.3f}}<br>weight %{{customdata:.0f}}<extra></extra>",
        ))
        if math.isnan(fit["slope"]):
            continue
        x = fitted_span(fit["intercept"], fit["slope"], part["entropy"].min(), part["entropy"].max())
        fig.add_trace(go.Scatter(
            x=x, y=fit["intercept"] + fit["slope"] * x, mode="lines", legendgroup=run, showlegend=False,
            name=f"{run} fit", line=dict(color=colors[run], width=2.5),
            hovertemplate=f"{html.escape(run)}: {law}<extra></extra>",
        ))
    fig.update_yaxes(rangemode="tozero")  # acceptance from 0: a spread of 0.01 must not fill the chart like a trend
    fig.update_xaxes(rangemode="tozero")
    return apply_layout(fig, "Acceptance vs entropy", "policy entropy H(p) (nats)", y_title, height=460)
