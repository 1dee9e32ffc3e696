"""Metrics over time: tidy per-step tables and line figures with smoothing."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

from bebop.plots.style import MARKERS_UNDER, X_AXES, _check_columns, _colors, _layout, _runs, smooth, thin


def over_time(trains: Mapping[str, pd.DataFrame], columns: Sequence[str], *, x: str = "step") -> pd.DataFrame:
    """[run, x, *columns] for every run that has all `columns` (missing runs are simply left out)."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {list(X_AXES)}, got {x!r}")
    x_col = X_AXES[x][0]
    frames = []
    for run, train in trains.items():
        if not set(columns) <= set(train.columns) or x_col not in train.columns:
            continue
        part = train[[x_col, *columns]].copy()
        if x == "time":
            part[x_col] = part[x_col] / 60.0  # minutes read better than seconds on a long run
        frames.append(part.rename(columns={x_col: x}).assign(run=run))
    if not frames:
        return pd.DataFrame(columns=["run", x, *columns])
    return pd.concat(frames, ignore_index=True)[["run", x, *columns]]


def numeric_series(frames: Mapping[str, pd.DataFrame]) -> list[str]:
    """Every numeric column logged by any of `frames` (the x axes aside), sorted: what a user can plot."""
    skip = {column for column, _ in X_AXES.values()}
    found = {c for frame in frames.values() for c in frame.select_dtypes("number").columns if c not in skip}
    return sorted(found)


def lines(data: pd.DataFrame, columns: Sequence[str], *, title: str, y_title: str, x: str = "step",
          smoothing: float = 0.0, colors: Mapping[str, str] | None = None,
          labels: Mapping[str, str] | None = None) -> go.Figure:
    """One line per (run, column): colour = run, dash = column. With smoothing the raw trace stays, faint."""
    _check_columns(data, ("run", x, *columns), "lines")
    colors = _colors(_runs(data), colors)
    dashes = ("solid", "dash", "dot", "dashdot", "longdash")
    fig = go.Figure()
    for run in _runs(data):
        part = data[data["run"] == run]
        for j, column in enumerate(columns):
            label = (labels or {}).get(column, column)
            name = run if len(columns) == 1 else f"{run} · {label}"
            xs, raw = part[x].to_numpy(), part[column].to_numpy(dtype=float)
            keep = thin(len(part))
            style = dict(color=colors[run], dash=dashes[j % len(dashes)], width=2)
            if smoothing > 0:
                fig.add_trace(go.Scatter(x=xs[keep], y=raw[keep], mode="lines", name=f"{name} (raw)",
                                         legendgroup=run, showlegend=False, opacity=0.25,
                                         line=dict(color=colors[run], width=1), hoverinfo="skip"))
            # The legend lists runs (colour) once, and the columns (dash) once each, below.
            mode = "lines+markers" if len(part) < MARKERS_UNDER else "lines"
            fig.add_trace(go.Scatter(x=xs[keep], y=smooth(raw, smoothing)[keep], mode=mode,
                                     name=run if j == 0 else name, legendgroup=run, showlegend=j == 0, line=style,
                                     hovertemplate=f"{html.escape(name)}<br>%{{x}}: %{{y:.4g}}<extra></extra>"))
    if len(columns) > 1:
        for j, column in enumerate(columns):
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=(labels or {}).get(column, column),
                                     line=dict(color="#555", dash=dashes[j % len(dashes)], width=2)))
    return _layout(fig, title, X_AXES[x][1], y_title)
