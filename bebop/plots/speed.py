"""Pooled tables: per-position acceptance, step-time breakdown, measured speedup and its theoretical bound; with
gamma="auto", the depths the engine chose and the step costs it measured; the draft-health residual."""

from __future__ import annotations

import math
import re
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


# ---- gamma="auto": the depth the engine chose, the step costs it measured, and the draft-health residual -------
_CHOSEN = re.compile(r"spec/num_gamma_chosen/(\d+)")
_COST = re.compile(r"engine/cost/(\d+)/(\d+)/steps")


def chosen_depths(trains: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """[run, step, gamma, share]: the share of each RL step's engine steps that ran at depth γ, for runs whose
    engine chose the depth (gamma="auto"; `spec/num_gamma_chosen/{γ}` counters)."""
    rows = []
    for run, train in trains.items():
        columns = {int(m.group(1)): c for c in train.columns if (m := _CHOSEN.fullmatch(c))}
        if not columns:
            continue
        counts = train[list(columns.values())].fillna(0).to_numpy()  # [steps, depths]
        totals = counts.sum(1, keepdims=True)
        shares = np.divide(counts, totals, out=np.zeros_like(counts, dtype=float), where=totals > 0)
        for step, share_row in zip(train["step"], shares):
            rows += [(run, int(step), gamma, float(share)) for gamma, share in zip(columns, share_row)]
    return pd.DataFrame(rows, columns=["run", "step", "gamma", "share"])


def chosen_depth_figure(table: pd.DataFrame, *, colors: Mapping[str, str] | None = None) -> go.Figure:
    """Mean chosen γ per RL step, one line per run; hover shows the full split."""
    _check_columns(table, ("run", "step", "gamma", "share"), "chosen_depth_figure")
    colors = _colors(_runs(table), colors)
    fig = go.Figure()
    for run in _runs(table):
        part = table[table["run"] == run]
        mean = (part["gamma"] * part["share"]).groupby(part["step"]).sum()
        split = part.groupby("step").apply(
            lambda g: ", ".join(f"γ={int(a)}: {b:.0%}" for a, b in zip(g["gamma"], g["share"]) if b > 0))
        fig.add_trace(go.Scatter(x=mean.index, y=mean.values, name=run, mode="lines+markers",
                                 line_color=colors[run], customdata=split.reindex(mean.index).values,
                                 hovertemplate="step %{x}<br>mean γ %{y:.2f}<br>%{customdata}<extra></extra>"))
    return _layout(fig, "Draft depth chosen by the engine (gamma=auto)", "RL step", "mean γ over engine steps")


def measured_costs(trains: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """[run, rows, gamma, seconds, steps]: the engine's measured seconds per step in each cost-table cell (rows
    bucket, γ), pooled over the run: what gamma="auto" chose from."""
    rows = []
    for run, train in trains.items():
        for column in train.columns:
            if (m := _COST.fullmatch(column)) is None:
                continue
            steps = float(train[column].fillna(0).sum())
            seconds = float(train[column.removesuffix("steps") + "seconds"].fillna(0).sum())
            if steps > 0:
                rows.append((run, int(m.group(1)), int(m.group(2)), seconds / steps, steps))
    return pd.DataFrame(rows, columns=["run", "rows", "gamma", "seconds", "steps"]).sort_values(
        ["run", "rows", "gamma"], ignore_index=True)


def measured_cost_figure(table: pd.DataFrame) -> go.Figure:
    """Seconds per engine step against γ, one line per (run, rows bucket), relative to γ = 0 where it was measured:
    the cost side of the choice."""
    _check_columns(table, ("run", "rows", "gamma", "seconds", "steps"), "measured_cost_figure")
    fig = go.Figure()
    for (run, rows), part in table.groupby(["run", "rows"]):
        plain = part.loc[part["gamma"] == 0, "seconds"]
        base = float(plain.iloc[0]) if len(plain) else float(part["seconds"].min())
        fig.add_trace(go.Scatter(x=part["gamma"], y=part["seconds"] / base, name=f"{run} · {rows} rows",
                                 mode="lines+markers", customdata=np.stack([part["seconds"] * 1e3, part["steps"]], -1),
                                 hovertemplate="γ=%{x}: %{y:.2f}× a plain step<br>%{customdata[0]:.2f} ms over "
                                               "%{customdata[1]:.0f} steps<extra></extra>"))
    fig.update_xaxes(dtick=1)
    return _layout(fig, "Measured engine step cost by depth", "γ", "seconds per step / plain step")


def draft_health(trains: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """[run, step, residual, residual_lo, residual_hi, alarm, warning] from `draft_health/*` (bebop.rl.draft_health):
    measured - predicted acceptance per RL step, with its interval; warning is the alarm's text or ""."""
    rows = []
    fields = ("residual", "residual_lo", "residual_hi", "alarm")
    for run, train in trains.items():
        if "draft_health/residual" not in train.columns:
            continue
        part = train.dropna(subset=["draft_health/residual"])
        warnings = part["draft_health/warning"].fillna("") if "draft_health/warning" in part else [""] * len(part)
        for step, *values, warning in zip(part["step"], *(part[f"draft_health/{f}"] for f in fields), warnings):
            rows.append((run, int(step), *map(float, values), str(warning)))
    return pd.DataFrame(rows, columns=["run", "step", *fields, "warning"])


def draft_health_figure(table: pd.DataFrame, *, colors: Mapping[str, str] | None = None) -> go.Figure:
    """Residual acceptance (measured - the entropy law's prediction) per RL step with its interval; red marks the
    steps whose interval excludes 0."""
    _check_columns(table, ("run", "step", "residual", "residual_lo", "residual_hi", "alarm"), "draft_health_figure")
    colors = _colors(_runs(table), colors)
    fig = go.Figure()
    for run in _runs(table):
        part = table[table["run"] == run]
        fig.add_trace(go.Scatter(
            x=part["step"], y=part["residual"], name=run, mode="lines+markers", line_color=colors[run],
            marker_color=["#E45756" if a else colors[run] for a in part["alarm"]],
            error_y=dict(type="data", symmetric=False, array=part["residual_hi"] - part["residual"],
                         arrayminus=part["residual"] - part["residual_lo"]),
            hovertemplate="step %{x}<br>residual %{y:+.3f}<extra></extra>"))
    fig.add_hline(y=0.0, line={"color": "#555", "dash": "dot", "width": 1})
    return _layout(fig, "Draft health: acceptance minus the entropy law's prediction", "RL step", "residual")
