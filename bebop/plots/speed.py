"""Pooled tables: per-position acceptance, step-time breakdown, measured speedup and its theoretical bound."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from bebop import metrics
from bebop.plots.style import ACCEPT_LENGTH, _check_columns, _colors, _layout, _runs, has_spec, pooled

# The engine's decode-loop counters (bebop.engine.generate: seconds summed over the rollout, and its verify steps).
SPEEDUP_COLUMNS = ["run", "accept_length", "measured_end_to_end", "measured_rollout", "theoretical", "draft_cost",
                   "verify_cost", "costs"]


def positions(trains: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Pooled over each run: [run, position, acceptance_rate (vLLM, of all drafts), alpha (conditional α_i)]."""
    rows = []
    for run, train in trains.items():
        if not has_spec(train):
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
    """Generation, update and the whole step as bars side by side: async steps overlap the first two, so
    stacking them would draw bars longer than the step."""
    _check_columns(table, ("run", "gen", "update", "step"), "step_time_figure")
    fig = go.Figure()
    for column, label, color in (("gen", "generation", "#4C78A8"), ("update", "update", "#F58518"),
                                 ("step", "whole step", "#54A24B")):
        fig.add_trace(go.Bar(y=table["run"], x=table[column], name=label, orientation="h", marker_color=color,
                             hovertemplate=f"%{{y}}<br>{label}: %{{x:.2f}} s<extra></extra>"))
    fig.update_layout(barmode="group")
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, "Step time (async overlaps generation and update)",
                   "mean seconds per RL step", "", height=max(260, 70 + 70 * len(table)))


def step_costs(train: pd.DataFrame) -> dict[str, float] | None:
    """Measured seconds per verify step of the engine, pooled over the run (`metrics.engine_step_costs`); None when
    the run did not log the engine's counters."""
    if not set(metrics.ENGINE_COUNTERS) <= set(train.columns):
        return None
    return metrics.engine_step_costs(train[list(metrics.ENGINE_COUNTERS)].sum().to_dict())


def _bound(train: pd.DataFrame, plain_step_s: float | None, draft_cost: float | None,
           verify_cost: float | None) -> dict:
    """accept length and the theoretical speedup of one MTP run, with the costs it used and where they came from."""
    rates = metrics.derive(pooled(train))
    gamma = int(train["spec/gamma"].dropna().iloc[0])
    alphas = [rates[f"spec/alpha_pos/{i}"] for i in range(gamma)]
    row = {"accept_length": rates[ACCEPT_LENGTH], "theoretical": math.nan, "draft_cost": draft_cost,
           "verify_cost": verify_cost, "costs": "assumed"}
    if draft_cost is None or verify_cost is None:
        costs = step_costs(train)
        if costs is None or not plain_step_s:
            return {**row, "costs": "not logged" if costs is None else "no plain baseline timed"}
        row.update(draft_cost=costs["draft_s"] / gamma / plain_step_s, verify_cost=costs["verify_s"] / plain_step_s,
                   costs="measured")
    if not any(math.isnan(a) for a in alphas):
        row["theoretical"] = metrics.theoretical_speedup(alphas, gamma, draft_cost=row["draft_cost"],
                                                         verify_cost=row["verify_cost"])
    return row


def speedup_table(trains: Mapping[str, pd.DataFrame], baseline: str, *, draft_cost: float | None = None,
                  verify_cost: float | None = None) -> pd.DataFrame:
    """Measured speedup against `baseline`, and apart from it the theoretical bound from pooled acceptance.

    measured_* = baseline mean seconds / run mean seconds (whole step; generation only). theoretical =
    metrics.theoretical_speedup from the pooled conditional α_i, with draft and verify costs in units of a
    plain decode step. By default both costs are measured: the run's engine counters per verify step over
    the baseline's (a run without MTP) plain step; `draft_cost` and `verify_cost` replace them with assumptions
    (`costs` says which). It bounds the decode loop, so compare it with measured_rollout.
    """
    if baseline not in trains:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {list(trains)}")
    times = step_times(trains).set_index("run")
    if baseline not in times.index:
        raise ValueError(f"baseline {baseline!r} has no timing_s/* columns")
    base = trains[baseline]
    base_costs = step_costs(base) if not has_spec(base) else None
    plain_step_s = base_costs["verify_s"] if base_costs else None
    rows = []
    for run, train in trains.items():
        if run not in times.index:
            continue
        row = {"run": run, "measured_end_to_end": times.loc[baseline, "step"] / times.loc[run, "step"],
               "measured_rollout": times.loc[baseline, "gen"] / times.loc[run, "gen"],
               "accept_length": math.nan, "theoretical": 1.0, "draft_cost": math.nan, "verify_cost": math.nan,
               "costs": "no MTP"}
        if has_spec(train):
            row.update(_bound(train, plain_step_s, draft_cost, verify_cost))
        rows.append(row)
    return pd.DataFrame(rows, columns=SPEEDUP_COLUMNS)


def _bars(fig: go.Figure, table: pd.DataFrame, column: str, label: str, color: str) -> None:
    fig.add_trace(go.Bar(x=table["run"], y=table[column], name=label, marker_color=color,
                         text=[f"{v:.2f}×" if np.isfinite(v) else "" for v in table[column]], textposition="outside"))


def speedup_figure(table: pd.DataFrame, baseline: str) -> go.Figure:
    """What was measured: each run's time over the baseline's, whole step and generation."""
    _check_columns(table, ("run", "measured_end_to_end", "measured_rollout"), "speedup_figure")
    fig = go.Figure()
    _bars(fig, table, "measured_end_to_end", "whole step", "#4C78A8")
    _bars(fig, table, "measured_rollout", "generation", "#72B7B2")
    fig.add_hline(y=1.0, line={"color": "#555", "dash": "dot", "width": 1})
    fig.update_layout(barmode="group")
    return _layout(fig, f"Measured speedup over {baseline}", "", "speedup (×)")


def bound_figure(table: pd.DataFrame) -> go.Figure:
    """What theory allows: the decode loop's bound from pooled acceptance and the costs named in `costs`."""
    _check_columns(table, ("run", "theoretical", "costs"), "bound_figure")
    spec = table[table["costs"].isin(("measured", "assumed"))]
    fig = go.Figure()
    for costs, color in (("measured", "#54A24B"), ("assumed", "#BAB0AC")):
        part = spec[spec["costs"] == costs]
        if len(part):
            _bars(fig, part, "theoretical", f"from {costs} step costs", color)
    fig.add_hline(y=1.0, line={"color": "#555", "dash": "dot", "width": 1})
    return _layout(fig, "Theoretical speedup of the decode loop (bound)", "", "speedup (×)")
