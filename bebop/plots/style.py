"""Shared constants and helpers of the figures: colours, thinning, smoothing, layout, pooled counters."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from bebop import metrics

MAX_POINTS = 1500
PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#EECA3B", "#9D755D",
           "#FF9DA6", "#BAB0AC")
ORIGIN_COLORS = {"accepted": "#2E9E5B", "recovered": "#E8833A", "bonus": "#3C78D8", "plain": "#9AA0A6"}
X_AXES = {"step": ("step", "RL step"), "time": ("time", "wall time (min)"), "tokens": ("tokens", "generated tokens")}
ACCEPT_LENGTH = "spec/accept_length"
TEMPLATE = "plotly_white"
# What pooling speculative counters needs; a run written by another loop may carry only some of them.
SPEC_FIELDS = ("spec/gamma", "spec/num_drafts", "spec/num_draft_tokens", "spec/num_accepted_tokens")
MARKERS_UNDER = 60  # a series this short also draws its points: a one-step run is a point, not nothing


def run_colors(runs: Iterable[str]) -> dict[str, str]:
    """One colour per run, by order: pass the page's run list so every figure agrees."""
    return {run: PALETTE[i % len(PALETTE)] for i, run in enumerate(dict.fromkeys(runs))}


# Pairs of one hue, dark then light: a head (or loss) keeps its hue in every figure of a notebook, and its two
# verification rules are told apart by shade (RS dark, TO light), so "ce · rs" is one colour everywhere it appears.
PAIRED = (("#1F5A96", "#8DB8E3"), ("#C4610A", "#F9BB7A"), ("#2F7D32", "#93D08A"), ("#A8322F", "#F19C9A"),
          ("#6A3F8F", "#C5A6DD"), ("#5E4A3B", "#C2A995"))
SHADE = {"rs": 0, "to": 1}  # a method's shade in its head's pair; any other method takes the dark one


def series_colors(keys: Iterable[tuple[str, str]], *, label: str = "{head} · {method}") -> dict[str, str]:
    """One colour per (head, method) series, by head order: the map every figure of a notebook draws with.

    `label` formats each key into the series name the figures use (e.g. "engine · {head} {method}" for
    `token_points`' runs), so two figures that name the same series differently still colour it alike.
    """
    keys = list(dict.fromkeys(keys))
    heads = list(dict.fromkeys(head for head, _ in keys))
    return {label.format(head=head, method=method): PAIRED[heads.index(head) % len(PAIRED)][SHADE.get(method, 0)]
            for head, method in keys}


def thin(n: int, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices of at most `max_points` evenly spaced rows out of n, always keeping the first and last."""
    if max_points < 2:
        raise ValueError(f"max_points must be >= 2, got {max_points}")
    if n <= max_points:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_points).round().astype(int))


def smooth(values: Sequence[float], weight: float) -> np.ndarray:
    """Debiased EMA (TensorBoard's slider): weight 0 is the raw series, 0.99 very smooth; NaNs are skipped."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must lie in [0, 1), got {weight}")
    series = pd.Series(values, dtype=float)
    if weight == 0.0:
        return series.to_numpy()
    return series.ewm(alpha=1.0 - weight, adjust=True, ignore_na=True).mean().to_numpy()


def apply_layout(fig: go.Figure, title: str, x_title: str, y_title: str, height: int = 380) -> go.Figure:
    fig.update_layout(
        template=TEMPLATE, title=dict(text=title, x=0.01, xanchor="left"), height=height,
        margin=dict(l=60, r=20, t=50, b=40), hovermode="closest", uirevision="keep",
        showlegend=True,  # Plotly hides a one-trace legend, and then nobody knows whose point that is
        # Below the axes, anchored to the figure's bottom edge rather than the plot's, so it never covers the
        # x-axis title (run names are long, and a legend on top fights the title for room).
        legend=dict(orientation="h", yref="container", yanchor="bottom", y=0.0, xanchor="left", x=0.0),
    )
    fig.update_layout(height=fig.layout.height + 40, margin_b=90)
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title)
    return fig


def integer_ticks(fig: go.Figure, steps, axis: str = "x") -> None:
    """Whole-number ticks on a step axis: a short run would otherwise get ticks at 0.2, 0.4, ... (Plotly's choice
    for a narrow range); a long one keeps Plotly's spacing, which is whole there, without decimals."""
    values = pd.to_numeric(pd.Series(steps), errors="coerce").dropna()
    span = float(values.max() - values.min()) if len(values) else 0.0
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(tickformat="d", **({"dtick": 1} if span <= 10 else {}))


def fill_colors(runs: Sequence[str], given: Mapping[str, str] | None) -> dict[str, str]:
    """`given` colours, with unused palette colours for runs it does not cover (e.g. eval sub-series)."""
    colors = dict(given or {})
    spare = [c for c in PALETTE if c not in colors.values()] or list(PALETTE)
    for i, run in enumerate(r for r in runs if r not in colors):
        colors[run] = spare[i % len(spare)]
    return colors


def run_names(data: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(data["run"])) if len(data) else []


def floats(column: pd.Series) -> np.ndarray:
    return np.array(column, dtype=float)  # a writable copy: torch refuses pandas' read-only views


def check_columns(data: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    missing = [c for c in columns if c not in data.columns]
    if missing:
        raise ValueError(f"{what} needs columns {missing}; got {list(data.columns)}")


def missing_spec(train: pd.DataFrame) -> list[str]:
    """The SPEC_FIELDS a train stream lacks (all of them: a run without MTP; some: a partial writer)."""
    return [c for c in SPEC_FIELDS if c not in train.columns or not train[c].notna().any()]


def has_spec(train: pd.DataFrame) -> bool:
    """Whether the stream's speculative counters can be pooled into rates."""
    return not missing_spec(train)


def pooled(train: pd.DataFrame) -> dict:
    """`metrics.pool` of every row, vectorised (column sums), so a long run stays cheap to redraw.

    Rows without MTP (no spec/gamma) are ignored; rows that disagree on γ or method cannot be pooled.
    """
    missing = missing_spec(train)
    if len(missing) == len(SPEC_FIELDS):
        raise ValueError("no speculative counters to pool (a run without MTP rollouts)")
    if missing:
        raise ValueError(f"cannot pool speculative counters: the train records lack {', '.join(missing)}")
    spec = train[train["spec/gamma"].notna()]
    total = spec.select_dtypes("number").sum().to_dict()
    for key in ("spec/gamma", "spec/method"):
        values = spec[key].dropna().unique() if key in spec.columns else []
        if len(values) > 1:
            raise ValueError(f"cannot pool rows with different {key}: {list(values)}")
        if len(values):
            total[key] = values[0]
    total["spec/gamma"] = int(total["spec/gamma"])
    return metrics.pool([total])
