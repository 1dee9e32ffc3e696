"""The Eq.-16 decomposition of an acceptance change into entropy and mismatch parts."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bebop import metrics
from bebop.plots.style import ACCEPT_LENGTH, check_columns, floats, apply_layout, run_names, integer_ticks, smooth, thin


def decomposition_data(trains: Mapping[str, pd.DataFrame], *, fit_fraction: float = 0.2) -> pd.DataFrame:
    """PAPER Eq. 16 per run: change of accept length since the start = entropy part + mismatch part."""
    frames = []
    for run, train in trains.items():
        if not {ACCEPT_LENGTH, "actor/entropy"} <= set(train.columns):
            continue
        part = train[["step", ACCEPT_LENGTH, "actor/entropy"]].dropna()
        try:
            dec = metrics.decompose_acceptance(floats(part[ACCEPT_LENGTH]), floats(part["actor/entropy"]),
                                               fit_fraction=fit_fraction)
        except ValueError:  # too few steps yet, or a flat entropy in the fitting window
            continue
        frames.append(pd.DataFrame({"run": run, "step": part["step"].to_numpy(), "total": dec.total.numpy(),
                                    "entropy_part": dec.entropy_part.numpy(),
                                    "mismatch_part": dec.mismatch_part.numpy(), "slope": dec.slope}))
    columns = ["run", "step", "total", "entropy_part", "mismatch_part", "slope"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def decomposition_figure(data: pd.DataFrame, *, smoothing: float = 0.6) -> go.Figure:
    """One panel per run (runs side by side, shared y): total change, entropy part and mismatch part."""
    check_columns(data, ("run", "step", "total", "entropy_part", "mismatch_part"), "decomposition_figure")
    parts = {"total": ("total Δ", "#333333", "solid"), "entropy_part": ("entropy part", "#4C78A8", "dash"),
             "mismatch_part": ("mismatch part", "#E45756", "dot")}
    runs = run_names(data)
    cols = min(4, max(1, len(runs)))
    rows = max(1, math.ceil(len(runs) / cols))
    fig = make_subplots(rows=rows, cols=cols, shared_yaxes=True, subplot_titles=runs,
                        horizontal_spacing=0.03, vertical_spacing=0.16)
    for k, run in enumerate(runs):
        part = data[data["run"] == run]
        keep = thin(len(part))
        steps = part["step"].to_numpy()[keep]
        for column, (label, color, dash) in parts.items():
            values = smooth(part[column].to_numpy(dtype=float), smoothing)[keep]
            fig.add_trace(go.Scatter(x=steps, y=values, mode="lines", name=label, legendgroup=column,
                                     showlegend=k == 0, line=dict(color=color, dash=dash, width=2),
                                     hovertemplate=f"{html.escape(run)} · {label}<br>step %{{x}}: %{{y:+.3f}}<extra></extra>"),
                          row=k // cols + 1, col=k % cols + 1)
        fig.add_hline(y=0.0, line=dict(color="#999", width=1), row=k // cols + 1, col=k % cols + 1)
    fig = apply_layout(fig, "Eq. 16: change in accept length = entropy part + mismatch part (x: RL step)", "", "",
                  height=170 + 230 * rows)
    fig.update_yaxes(title_text="Δ accept length", col=1)
    integer_ticks(fig, data["step"])
    fig.update_layout(margin=dict(t=90), legend=dict(y=-0.1 if rows == 1 else -0.05))
    return fig
