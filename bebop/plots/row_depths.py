"""Each row its own depth (gamma="rows", `bebop.engine.depth.rows`): the distribution of the depths the engine gave
its rows per RL step, and the verify-token budget it spent, with the share of rows that drafted by prompt lookup and
how well its cost model priced the steps.

Both read a rollout's counters (`bebop.engine.depth.counters`): `spec/num_row_depth/{d}` row-steps at each depth d,
`spec/num_budget_tokens` the verified tokens the budgets allowed, `spec/num_lookup_row_steps`, `engine/num_row_steps`
and `engine/priced_steps/{predicted,measured}_s`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from bebop.plots.style import apply_layout, check_columns, fill_colors, integer_ticks, run_names

_DEPTH = re.compile(r"spec/num_row_depth/(\d+)")
# Depth d's colour: plain decoding grey, then deeper drafts darker.
DEPTH_COLORS = ("#BAB0AC", "#C6DBEF", "#9ECAE1", "#6BAED6", "#3182BD", "#08519C", "#08306B")
BUDGET_COLUMNS = ("run", "step", "budget_per_row", "lookup_share", "predicted_s", "measured_s")


def row_depths(trains: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """[run, step, depth, share]: the share of each RL step's row-steps the engine ran at each depth (runs with
    per-row depths only)."""
    rows = []
    for run, train in trains.items():
        columns = {int(m.group(1)): c for c in train.columns if (m := _DEPTH.fullmatch(c))}
        if not columns:
            continue
        counts = train[list(columns.values())].fillna(0).to_numpy(dtype=float)  # [steps, depths]
        totals = counts.sum(1, keepdims=True)
        shares = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
        for step, share_row, total in zip(train["step"], shares, totals[:, 0]):
            if total > 0:
                rows += [(run, int(step), depth, float(share)) for depth, share in zip(columns, share_row)]
    return pd.DataFrame(rows, columns=["run", "step", "depth", "share"])


def row_depth_figure(table: pd.DataFrame, *, colors: Mapping[str, str] | None = None) -> go.Figure:
    """The depth distribution per RL step, stacked (one stack per run, coloured by depth; its mean depth on hover;
    `colors` is taken for the pages' uniform call and unused: depth, not run, colours this figure)."""
    check_columns(table, ("run", "step", "depth", "share"), "row_depth_figure")
    fig = go.Figure()
    for run in run_names(table):
        part = table[table["run"] == run]
        mean = (part["depth"] * part["share"]).groupby(part["step"]).sum()
        for depth, by_depth in part.groupby("depth"):
            fig.add_trace(go.Scatter(
                x=by_depth["step"], y=by_depth["share"], stackgroup=run, name=f"{run} · depth {depth}",
                legendgroup=run, mode="lines", line=dict(width=0.5, color=DEPTH_COLORS[min(depth, 6)]),
                customdata=mean.reindex(by_depth["step"]).values,
                hovertemplate=f"{run}<br>step %{{x}}<br>depth {depth}: %{{y:.0%}} of row-steps"
                              "<br>mean depth %{customdata:.2f}<extra></extra>"))
    integer_ticks(fig, table["step"])
    fig.update_yaxes(range=[0, 1], tickformat=".0%")
    return apply_layout(fig, "Each row's draft depth (share of row-steps per depth)", "RL step", "row-steps")


def budgets(trains: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """[run, step, budget_per_row, lookup_share, predicted_s, measured_s] per RL step: the verified tokens the engine
    allowed per row-step (1: plain decoding), the share of row-steps drafted by prompt lookup, and the seconds its cost
    model predicted for the steps it priced beside what they took."""
    needed = ("spec/num_budget_tokens", "engine/num_row_steps")
    rows = []
    for run, train in trains.items():
        if not set(needed) <= set(train.columns):
            continue
        part = train.dropna(subset=list(needed))
        part = part[part["engine/num_row_steps"] > 0]
        get = lambda c: part[c].fillna(0).to_numpy(dtype=float) if c in part else np.zeros(len(part))  # noqa: E731
        row_steps = get("engine/num_row_steps")
        for values in zip(part["step"], get("spec/num_budget_tokens") / row_steps,
                          get("spec/num_lookup_row_steps") / row_steps, get("engine/priced_steps/predicted_s"),
                          get("engine/priced_steps/measured_s")):
            rows.append((run, int(values[0]), *map(float, values[1:])))
    return pd.DataFrame(rows, columns=list(BUDGET_COLUMNS))


def budget_figure(table: pd.DataFrame, *, colors: Mapping[str, str] | None = None) -> go.Figure:
    """Verified tokens per row-step against the RL step, one line per run; hover gives the lookup share and the cost
    model's predicted / measured seconds."""
    check_columns(table, BUDGET_COLUMNS, "budget_figure")
    colors = fill_colors(run_names(table), colors)
    fig = go.Figure()
    for run in run_names(table):
        part = table[table["run"] == run]
        ratio = np.divide(part["measured_s"], part["predicted_s"], out=np.full(len(part), np.nan),
                          where=part["predicted_s"].to_numpy() > 0)
        fig.add_trace(go.Scatter(
            x=part["step"], y=part["budget_per_row"], name=run, mode="lines+markers", line_color=colors[run],
            customdata=np.stack([part["lookup_share"], ratio], -1),
            hovertemplate="step %{x}<br>%{y:.2f} verified tokens per row-step<br>prompt lookup %{customdata[0]:.0%}"
                          " of row-steps<br>measured / predicted step seconds %{customdata[1]:.2f}<extra></extra>"))
    integer_ticks(fig, table["step"])
    fig.update_yaxes(rangemode="tozero")
    return apply_layout(fig, "Verify-token budget per row (1 = plain decoding)", "RL step", "verified tokens / row-step")
