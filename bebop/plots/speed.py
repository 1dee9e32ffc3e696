"""Pooled tables: per-position acceptance, step-time breakdown, measured vs theoretical speedup."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from bebop import metrics
from bebop.plots.style import ACCEPT_LENGTH, _check_columns, _colors, _layout, _runs, pooled


def positions(trains: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Pooled over each run: [run, position, acceptance_rate (vLLM, of all drafts), alpha (conditional α_i)]."""
    rows = []
    for run, train in trains.items():
        if "spec/num_drafts" not in train.columns:
            continue
        rates = metrics.derive(pooled(train))
        for i in range(int(train["spec/gamma"].dropna().iloc[0])):
            rows.append((run, i + 1, rates[f"spec/acceptance_rate_pos/{i}"], rates[f"spec/alpha_pos/{i}"]))
    return pd.DataFrame(rows, columns=["run", "position", "acceptance_rate", "alpha"])


def positions_figure(table: pd.DataFrame, *, colors: Mapping[str, str] | None = None) -> go.Figure:
    _check_columns(table, ("run", "position", "acceptance_rate", "alpha"), "positions_figure")
    colors = _colors(_runs(table), colors)
    fig = go.Figure()
    for run in _runs(table):
        part = table[table["run"] == run]
        fig.add_trace(go.Bar(x=part["position"], y=part["acceptance_rate"], name=run, marker_color=colors[run],
                             customdata=part["alpha"],
                             hovertemplate="position %{x}<br>accepted / drafts %{y:.3f}<br>α_i %{customdata:.3f}<extra></extra>"))
    fig.update_layout(barmode="group")
    fig.update_xaxes(dtick=1)
    return _layout(fig, "Pooled acceptance per draft position", "draft position i", "accepted at i / drafts")


def step_times(trains: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Mean seconds per RL step: [run, gen, update, step] (async steps overlap gen and update)."""
    cols = {"timing_s/gen": "gen", "timing_s/update_actor": "update", "timing_s/step": "step"}
    rows = [{"run": run, **{short: float(t[col].mean()) for col, short in cols.items()}}
            for run, t in trains.items() if set(cols) <= set(t.columns)]
    return pd.DataFrame(rows, columns=["run", "gen", "update", "step"])


def step_time_figure(table: pd.DataFrame) -> go.Figure:
    _check_columns(table, ("run", "gen", "update", "step"), "step_time_figure")
    fig = go.Figure()
    fig.add_trace(go.Bar(y=table["run"], x=table["gen"], name="generation", orientation="h", marker_color="#4C78A8"))
    fig.add_trace(go.Bar(y=table["run"], x=table["update"], name="update", orientation="h", marker_color="#F58518"))
    fig.add_trace(go.Scatter(y=table["run"], x=table["step"], name="whole step", mode="markers",
                             marker=dict(symbol="diamond", size=13, color="#222", line=dict(color="white", width=1))))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, "Step time: generation vs update", "mean seconds per RL step", "",
                   height=max(260, 70 + 48 * len(table)))


def speedup_table(trains: Mapping[str, pd.DataFrame], baseline: str, *, draft_cost: float = 0.05,
                  verify_cost: float = 1.1) -> pd.DataFrame:
    """Measured speedup against `baseline` next to the theoretical one from pooled acceptance.

    measured_* = baseline mean seconds / run mean seconds (whole step; generation only). theoretical =
    metrics.theoretical_speedup from the pooled conditional α_i, with draft and verify costs in units of a
    plain decode step: it bounds the generation phase, so compare it with measured_rollout.
    """
    if baseline not in trains:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {list(trains)}")
    times = step_times(trains).set_index("run")
    if baseline not in times.index:
        raise ValueError(f"baseline {baseline!r} has no timing_s/* columns")
    rows = []
    for run, train in trains.items():
        if run not in times.index:
            continue
        row = {"run": run, "measured_end_to_end": times.loc[baseline, "step"] / times.loc[run, "step"],
               "measured_rollout": times.loc[baseline, "gen"] / times.loc[run, "gen"],
               "accept_length": math.nan, "theoretical": 1.0 if "spec/num_drafts" not in train.columns else math.nan}
        if "spec/num_drafts" in train.columns:
            rates = metrics.derive(pooled(train))
            gamma = int(train["spec/gamma"].dropna().iloc[0])
            alphas = [rates[f"spec/alpha_pos/{i}"] for i in range(gamma)]
            row["accept_length"] = rates[ACCEPT_LENGTH]
            if not any(math.isnan(a) for a in alphas):
                row["theoretical"] = metrics.theoretical_speedup(alphas, gamma, draft_cost=draft_cost,
                                                                 verify_cost=verify_cost)
        rows.append(row)
    return pd.DataFrame(rows, columns=["run", "accept_length", "measured_end_to_end", "measured_rollout", "theoretical"])


def speedup_figure(table: pd.DataFrame, baseline: str) -> go.Figure:
    _check_columns(table, ("run", "measured_end_to_end", "measured_rollout", "theoretical"), "speedup_figure")
    fig = go.Figure()
    for column, label, color in (("measured_end_to_end", "measured, whole step", "#4C78A8"),
                                 ("measured_rollout", "measured, generation", "#72B7B2"),
                                 ("theoretical", "theoretical (generation bound)", "#BAB0AC")):
        fig.add_trace(go.Bar(x=table["run"], y=table[column], name=label, marker_color=color,
                             text=[f"{v:.2f}×" if np.isfinite(v) else "" for v in table[column]], textposition="outside"))
    fig.add_hline(y=1.0, line=dict(color="#555", dash="dot", width=1))
    fig.update_layout(barmode="group")
    return _layout(fig, f"Speedup over {baseline}", "", "speedup (×)")
