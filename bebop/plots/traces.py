"""Metrics over time: tidy per-step tables and line figures with smoothing."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

from bebop.plots.style import (MARKERS_UNDER, X_AXES, check_columns, fill_colors, apply_layout, run_names, integer_ticks,
                               smooth, thin)


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


SERIES_KEYS = ("head", "rule")  # a stream with several records per step (the shadow stream) keys them by these


def by_series(frames: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Streams that log several records per step, one per head and rule (the shadow stream), split into one frame
    per series ("run · head · rule"), so a line joins one series' steps, not every record of each step in turn;
    other streams as they are."""
    out = {}
    for run, frame in frames.items():
        if not set(SERIES_KEYS) <= set(frame.columns):
            out[run] = frame
            continue
        for keys, part in frame.groupby(list(SERIES_KEYS), sort=False):
            out[" · ".join([run, *map(str, keys)])] = part
    return out


def numeric_series(frames: Mapping[str, pd.DataFrame]) -> list[str]:
    """Every numeric column logged by any of `frames` (the x axes aside), sorted: what a user can plot."""
    skip = {column for column, _ in X_AXES.values()}
    found = {c for frame in frames.values() for c in frame.select_dtypes("number").columns if c not in skip}
    return sorted(found)


def lines(data: pd.DataFrame, columns: Sequence[str], *, title: str, y_title: str, x: str = "step",
          smoothing: float = 0.0, colors: Mapping[str, str] | None = None,
          labels: Mapping[str, str] | None = None, x_title: str | None = None, from_zero: bool = False) -> go.Figure:
    """One line per (run, column): colour = run, dash = column. The data are the bold line; with smoothing a faint
    trend line rides on them (the bold line ends at the last value logged). `from_zero` starts the y axis at 0, so
    step-to-step noise on a quantity that is never negative does not fill the chart like a trend."""
    check_columns(data, ("run", x, *columns), "lines")
    colors = fill_colors(run_names(data), colors)
    dashes = ("solid", "dash", "dot", "dashdot", "longdash")
    fig = go.Figure()
    for run in run_names(data):
        part = data[data["run"] == run]
        for j, column in enumerate(columns):
            label = (labels or {}).get(column, column)
            name = run if len(columns) == 1 else f"{run} · {label}"
            xs, raw = part[x].to_numpy(), part[column].to_numpy(dtype=float)
            keep = thin(len(part))
            # The legend lists runs (colour) once, and the columns (dash) once each, below.
            mode = "lines+markers" if len(part) < MARKERS_UNDER else "lines"
            fig.add_trace(go.Scatter(x=xs[keep], y=raw[keep], mode=mode, name=run if j == 0 else name, legendgroup=run,
                                     showlegend=j == 0, line=dict(color=colors[run], dash=dashes[j % len(dashes)],
                                                                  width=2),
                                     hovertemplate=f"{html.escape(name)}<br>%{{x}}: %{{y:.4g}}<extra></extra>"))
            if smoothing > 0:
                fig.add_trace(go.Scatter(x=xs[keep], y=smooth(raw, smoothing)[keep], mode="lines",
                                         name=f"{name} (smoothed)", legendgroup=run, showlegend=False, opacity=0.35,
                                         line=dict(color=colors[run], dash=dashes[j % len(dashes)], width=3),
                                         hoverinfo="skip"))
    if len(columns) > 1:
        for j, column in enumerate(columns):
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=(labels or {}).get(column, column),
                                     line=dict(color="#555", dash=dashes[j % len(dashes)], width=2)))
    if from_zero:
        fig.update_yaxes(rangemode="tozero")
    if x == "step":
        integer_ticks(fig, data[x])
    return apply_layout(fig, title, x_title or X_AXES[x][1], y_title)
