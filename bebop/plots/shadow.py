"""The shadow heads of an RL run (`bebop.rl.shadow_report`): every scored head x rule along the run, its entropy law,
and how far each head's acceptance moved from start to end, frozen beside online.

A run with `--shadow-heads` scores every head on each step's rollouts under TO and RS at one depth (`--max-gamma`
with gamma "auto"), so the heads compare on the same tokens. The rollout's own accept length (the train stream's,
what the Live page draws) is at the depth the engine chose each step, and is drawn apart and labelled as such: it is
not one of the scored series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from bebop.plots.style import ACCEPT_LENGTH, apply_layout, check_columns, fill_colors

AS_DRAFTED = "rollout as drafted (the engine's chosen depth)"


def scored_depth(shadow: pd.DataFrame) -> int | None:
    """The depth every head was scored at (the shadow stream's `spec/gamma`), None where the stream does not say."""
    if "spec/gamma" not in shadow.columns or not shadow["spec/gamma"].notna().any():
        return None
    return int(shadow["spec/gamma"].dropna().max())


def over_steps(points: pd.DataFrame, train: pd.DataFrame | None = None) -> pd.DataFrame:
    """[run, step, acceptance]: each scored head · rule per RL step (`shadow_points`), then the rollout's accept length
    as drafted (`AS_DRAFTED`, from the train stream), what `plots.lines` draws."""
    check_columns(points, ("run", "step", "acceptance"), "over_steps")
    parts = [points[["run", "step", "acceptance"]]]
    if train is not None and {"step", ACCEPT_LENGTH} <= set(train.columns):
        drafted = train[["step", ACCEPT_LENGTH]].dropna().rename(columns={ACCEPT_LENGTH: "acceptance"})
        parts.append(drafted.assign(run=AS_DRAFTED)[["run", "step", "acceptance"]])
    return pd.concat(parts, ignore_index=True)


def drift_figure(summary: pd.DataFrame, *, colors: Mapping[str, str] | None = None, unit: str = "accept length") \
        -> go.Figure:
    """Each head · rule's mean over the first and the last window of steps (`shadow_summary`'s start and end, with
    their 95% bootstrap intervals), grouped by rule so frozen and online heads stand side by side."""
    check_columns(summary, ("head", "rule", "strategy", "start", "start_lo", "start_hi", "end", "end_lo", "end_hi",
                            "window"), "drift_figure")
    table = summary.sort_values(["rule", "strategy"], kind="stable")
    names = [f"{h} · {r} ({s})" for h, r, s in zip(table["head"], table["rule"], table["strategy"])]
    colors = fill_colors([f"{h} · {r}" for h, r in zip(table["head"], table["rule"])], colors)
    window = int(table["window"].max()) if len(table) else 0
    fig = go.Figure()
    for when, opacity in (("start", 0.45), ("end", 1.0)):
        values = table[when].to_numpy(dtype=float)
        fig.add_trace(go.Bar(
            x=names, y=values, name=f"{when} (mean of the {'first' if when == 'start' else 'last'} {window} steps)",
            marker_color=[colors[f"{h} · {r}"] for h, r in zip(table["head"], table["rule"])], opacity=opacity,
            text=[f"{v:.2f}" if math.isfinite(v) else "" for v in values], textposition="outside",
            error_y=dict(type="data", symmetric=False, array=table[f"{when}_hi"].to_numpy(dtype=float) - values,
                         arrayminus=values - table[f"{when}_lo"].to_numpy(dtype=float), color="#555"),
            hovertemplate=f"%{{x}}<br>{when}: %{{y:.3f}}<extra></extra>"))
    fig.update_layout(barmode="group")
    fig.update_yaxes(rangemode="tozero")
    return apply_layout(fig, "Start and end of the run, every head on the same rollouts (95% intervals)", "",
                        unit, height=420)


def law_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """`shadow_summary` as a page reads it: one row per head · rule with the slope and its interval as text, R², the
    flags, the within fit a flag points to, and start, end and relative change with their intervals."""

    def interval(value: float, lo: float, hi: float, pattern: str = "{:+.2f}") -> str:
        if not math.isfinite(value):
            return "—"
        bounds = "" if not (math.isfinite(lo) and math.isfinite(hi)) else \
            f" [{pattern.format(lo)}, {pattern.format(hi)}]"
        return pattern.format(value) + bounds

    rows = []
    for r in summary.to_dict("records"):
        rows.append({"head": r["head"], "rule": r["rule"], "strategy": r["strategy"],
                     "slope": interval(r["slope"], r["slope_lo"], r["slope_hi"]), "r2": r["r2"],
                     "points": r["points"], "flags": r["flags"] or "",
                     "within": interval(r["within_slope"], r["within_slope_lo"], r["within_slope_hi"])
                     + ("" if not math.isfinite(r["within_r2"]) else
                        f", R² {r['within_r2']:.2f}, {int(r['within_points'])} points"),
                     "start": interval(r["start"], r["start_lo"], r["start_hi"], "{:.2f}"),
                     "end": interval(r["end"], r["end_lo"], r["end_hi"], "{:.2f}"),
                     "relative_change": interval(100 * r["relative_change"], 100 * r["relative_change_lo"],
                                                 100 * r["relative_change_hi"], "{:+.0f}%")})
    return pd.DataFrame(rows)


def law_lines(rows: pd.DataFrame) -> list[str]:
    """`law_rows` as one line of text per head · rule: its slope with its interval, R², points and, for a flagged
    fit, the flags (the within fit's slope in them), as a page writes them out."""
    lines = []
    for r in rows.to_dict("records"):
        r2 = "—" if not math.isfinite(r["r2"]) else f"{r['r2']:.2f}"
        line = f"**{r['head']} · {r['rule']}** ({r['strategy']}): {r['slope']} per nat, R² {r2}, {r['points']} points"
        lines.append(line + (f"; {r['flags']}" if r["flags"] else ""))
    return lines


def series_order(points: pd.DataFrame) -> list[tuple[str, str]]:
    """(head, rule) pairs in the order the stream wrote them: what `plots.series_colors` colours."""
    return list(dict.fromkeys(zip(points["head"], points["rule"]))) if len(points) else []


def mean_depth(train: pd.DataFrame) -> float:
    """The engine's mean chosen depth over the run (`spec/num_gamma_chosen/{γ}` counters), NaN without them."""
    columns = {int(c.rsplit("/", 1)[1]): c for c in train.columns if c.startswith("spec/num_gamma_chosen/")}
    if not columns:
        return math.nan
    counts = np.array([train[c].fillna(0).sum() for c in columns.values()], dtype=float)
    return float((np.array(list(columns)) * counts).sum() / counts.sum()) if counts.sum() > 0 else math.nan
