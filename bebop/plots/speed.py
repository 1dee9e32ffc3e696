"""Pooled tables: per-position acceptance, step-time breakdown, measured speedups of paired runs beside their
prediction from measured costs (`bebop.speedup`); with gamma="auto", the depths the engine chose and the step costs it
measured; the draft-health residual."""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from bebop import metrics, speedup
from bebop.plots.style import check_columns, fill_colors, apply_layout, run_names, has_spec, integer_ticks, pooled

SPEEDUP_COLUMNS = ["run", "plain_run", "tokens_per_row_step", "step_cost", "predicted", "measured_rollout",
                   "measured_end_to_end", "measured_update", "response_ratio", "note", "credit"]


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
    check_columns(table, ("run", "position", "acceptance_rate", "alpha"), "positions_figure")
    colors = fill_colors(run_names(table), colors)
    fig = go.Figure()
    for run in run_names(table):
        part = table[table["run"] == run]
        fig.add_trace(go.Bar(x=part["position"], y=part["acceptance_rate"], name=run, marker_color=colors[run],
                             customdata=part["alpha"],
                             hovertemplate="position %{x}<br>accepted / drafts %{y:.3f}<br>α_i %{customdata:.3f}<extra></extra>"))
    fig.update_layout(barmode="group")
    fig.update_xaxes(dtick=1)
    return apply_layout(fig, "Pooled acceptance per draft position", "draft position i", "accepted at i / drafts")


def _records(train: pd.DataFrame) -> list[dict]:
    return train.to_dict("records")


# One colour per part of a step in every speed figure (step times, speedups, notebook 05's batch regime): the
# generation's bar and its speedup alike, the whole step's alike; a prediction grey (hatched where it is a bar).
SPEED_COLORS = {"generation": "#4C78A8", "update": "#F58518", "whole step": "#54A24B", "predicted": "#BAB0AC"}


def step_times(trains: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Seconds per RL step by `speedup.STATISTIC`: [run, gen, update (policy and head), step] (async steps overlap gen
    and update), and generated tokens per second of generation (tokens_per_s), read the same way."""
    needed = {"timing_s/gen", "timing_s/update_actor", "timing_s/step"}
    rows = []
    for run, train in trains.items():
        if needed <= set(train.columns):
            stats = speedup.step_stats(_records(train))
            rows.append({"run": run, "gen": stats["gen_s"], "update": stats["update_s"], "step": stats["step_s"],
                         "tokens_per_s": stats["tokens_per_s"]})
    return pd.DataFrame(rows, columns=["run", "gen", "update", "step", "tokens_per_s"])


def step_time_figure(table: pd.DataFrame) -> go.Figure:
    """Generation, update and the whole step as bars side by side: async steps overlap the first two, so
    stacking them would draw bars longer than the step."""
    check_columns(table, ("run", "gen", "update", "step"), "step_time_figure")
    fig = go.Figure()
    for column, label, color in (("gen", "generation", SPEED_COLORS["generation"]),
                                 ("update", "update", SPEED_COLORS["update"]),
                                 ("step", "whole step", SPEED_COLORS["whole step"])):
        fig.add_trace(go.Bar(y=table["run"], x=table[column], name=label, orientation="h", marker_color=color,
                             hovertemplate=f"%{{y}}<br>{label}: %{{x:.2f}} s<extra></extra>"))
    fig.update_layout(barmode="group")
    fig.update_yaxes(autorange="reversed")
    return apply_layout(fig, "Step time (async overlaps generation and update)",
                   "median seconds per RL step (steady steps)", "", height=max(260, 70 + 70 * len(table)))


def speedup_table(trains: Mapping[str, pd.DataFrame], pairs: Mapping[str, str]) -> pd.DataFrame:
    """One row per MTP run of `pairs` ({MTP run: its plain partner}, runs with the same workload: `bebop.speedup`):
    the measured speedups (generation, whole step, update) beside what the measured costs predict, the MTP run's answer
    length over the plain run's, the note flagging a measurement beyond its prediction and what the speedups owe to
    something other than drafting (`Speedup.credit`). Every number is `bebop.speedup`'s, as `bebop demo` prints it."""
    rows = []
    for run, plain in pairs.items():
        s = speedup.speedup(_records(trains[plain]), _records(trains[run]))
        rows.append({"run": run, "plain_run": plain, "tokens_per_row_step": s.tokens_per_row_step,
                     "step_cost": s.step_cost, "predicted": s.predicted, "measured_rollout": s.rollout,
                     "measured_end_to_end": s.end_to_end, "measured_update": s.update,
                     "response_ratio": s.response_ratio, "note": s.note(), "credit": "; ".join(s.credit())})
    return pd.DataFrame(rows, columns=SPEEDUP_COLUMNS)


def speedup_figure(table: pd.DataFrame) -> go.Figure:
    """Each MTP run's measured speedups over its plain partner, and beside them the prediction from measured costs
    (hatched: a prediction, not a measurement); 1 is plain decoding's speed."""
    check_columns(table, ("run", "measured_rollout", "measured_end_to_end", "predicted"), "speedup_figure")
    fig = go.Figure()
    for column, label, color, pattern in (
            ("measured_rollout", "generation, measured", SPEED_COLORS["generation"], ""),
            ("measured_end_to_end", "whole step, measured", SPEED_COLORS["whole step"], ""),
            ("predicted", "generation, predicted from measured costs", SPEED_COLORS["predicted"], "/")):
        fig.add_trace(go.Bar(y=table["run"], x=table[column], name=label, orientation="h", marker_color=color,
                             marker_pattern_shape=pattern, textposition="outside", cliponaxis=False,
                             text=[f"{v:.2f}×" if np.isfinite(v) else "" for v in table[column]],
                             hovertemplate=f"%{{y}}<br>{label}: %{{x:.2f}}×<extra></extra>"))
    fig.add_vline(x=1.0, line={"color": "#555", "dash": "dot", "width": 1})
    fig.update_layout(barmode="group")
    fig.update_yaxes(autorange="reversed")
    return apply_layout(fig, "Speedup over plain decoding at the same workload", "speedup (×, plain decoding = 1)", "",
                   height=max(260, 90 + 90 * len(table)))


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
    check_columns(table, ("run", "step", "gamma", "share"), "chosen_depth_figure")
    colors = fill_colors(run_names(table), colors)
    fig = go.Figure()
    for run in run_names(table):
        part = table[table["run"] == run]
        mean = (part["gamma"] * part["share"]).groupby(part["step"]).sum()
        split = part.groupby("step").apply(
            lambda g: ", ".join(f"γ={int(a)}: {b:.0%}" for a, b in zip(g["gamma"], g["share"]) if b > 0))
        fig.add_trace(go.Scatter(x=mean.index, y=mean.values, name=run, mode="lines+markers",
                                 line_color=colors[run], customdata=split.reindex(mean.index).values,
                                 hovertemplate="step %{x}<br>mean γ %{y:.2f}<br>%{customdata}<extra></extra>"))
    integer_ticks(fig, table["step"])
    fig.update_yaxes(rangemode="tozero")
    return apply_layout(fig, "Draft depth chosen by the engine (gamma=auto)", "RL step", "mean γ over engine steps")


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


def measured_cost_figure(table: pd.DataFrame, *, colors: Mapping[str, str] | None = None) -> go.Figure:
    """Seconds per engine step against γ in plain steps of the same rows bucket, one line per (run, rows bucket) that
    timed γ = 0: the cost side of the choice. A run is one colour (one legend entry), thicker lines for more rows;
    hover names the bucket."""
    check_columns(table, ("run", "rows", "gamma", "seconds", "steps"), "measured_cost_figure")
    colors = fill_colors(run_names(table), colors)
    widest = max(table["rows"], default=1)
    fig, shown = go.Figure(), set()
    for (run, rows), part in table.groupby(["run", "rows"], sort=False):
        plain = part.loc[part["gamma"] == 0, "seconds"]
        if not len(plain) or len(part) < 2:  # no plain step timed in this bucket: no unit to draw it in
            continue
        fig.add_trace(go.Scatter(
            x=part["gamma"], y=part["seconds"] / float(plain.iloc[0]), name=run, legendgroup=run,
            showlegend=run not in shown, mode="lines+markers",
            line=dict(color=colors[run], width=1 + 3 * rows / widest), marker=dict(color=colors[run], size=5),
            customdata=np.stack([part["seconds"] * 1e3, part["steps"]], -1),
            hovertemplate=f"{rows} rows, γ=%{{x}}: %{{y:.2f}}× a plain step<br>%{{customdata[0]:.2f}} ms over "
                          "%{customdata[1]:.0f} steps<extra></extra>"))
        shown.add(run)
    fig.update_xaxes(dtick=1)
    return apply_layout(fig, "Measured engine step cost by depth (a line per rows bucket)", "γ", "× a plain step")


def draft_health(trains: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """[run, step, residual, window_residual, residual_lo, residual_hi, alarm, warning] from `draft_health/*`
    (bebop.rl.draft_health): measured - predicted acceptance per RL step, the mean over the last steps and its
    bootstrap interval (what the alarm reads; NaN in runs written before it did); warning is the alarm's text or ""."""
    rows = []
    fields = ("residual", "window_residual", "residual_lo", "residual_hi", "alarm")
    for run, train in trains.items():
        if "draft_health/residual" not in train.columns:
            continue
        part = train.dropna(subset=["draft_health/residual"])
        warnings = part["draft_health/warning"].fillna("") if "draft_health/warning" in part else [""] * len(part)
        values = [part[f"draft_health/{f}"] if f"draft_health/{f}" in part else [float("nan")] * len(part)
                  for f in fields]
        for step, *numbers, warning in zip(part["step"], *values, warnings):
            rows.append((run, int(step), *map(float, numbers), str(warning)))
    return pd.DataFrame(rows, columns=["run", "step", *fields, "warning"])


def draft_health_figure(table: pd.DataFrame, *, colors: Mapping[str, str] | None = None) -> go.Figure:
    """Residual acceptance (measured - the entropy law's prediction) per RL step, and the mean of the last steps with
    its bootstrap interval (dotted); red marks the steps that raised the alarm."""
    check_columns(table, ("run", "step", "residual", "window_residual", "residual_lo", "residual_hi", "alarm"),
                  "draft_health_figure")
    colors = fill_colors(run_names(table), colors)
    fig = go.Figure()
    for run in run_names(table):
        part = table[table["run"] == run]
        fig.add_trace(go.Scatter(
            x=part["step"], y=part["residual"], name=run, mode="lines+markers", line_color=colors[run],
            marker_color=["#E45756" if a else colors[run] for a in part["alarm"]],
            hovertemplate="step %{x}<br>residual %{y:+.3f}<extra></extra>"))
        if part["window_residual"].notna().any():  # the window's mean residual and its bootstrap interval: what alarms
            fig.add_trace(go.Scatter(
                x=part["step"], y=part["window_residual"], name=f"{run} · last steps' mean", mode="lines",
                legendgroup=run, line=dict(color=colors[run], width=1, dash="dot"),
                error_y=dict(type="data", symmetric=False, array=part["residual_hi"] - part["window_residual"],
                             arrayminus=part["window_residual"] - part["residual_lo"], thickness=1, width=2),
                hovertemplate="step %{x}<br>mean of the last steps %{y:+.3f}<extra></extra>"))
    fig.add_hline(y=0.0, line={"color": "#555", "dash": "dot", "width": 1})
    integer_ticks(fig, table["step"])
    return apply_layout(fig, "Draft health: acceptance minus the entropy law's prediction", "RL step", "residual")
