"""The figures of bebop, shared by the dashboard (app/) and the notebooks: tidy DataFrames in, Plotly out.

Every figure comes in two halves. A `*_data` function turns train streams (`{run name: DataFrame}` as
`bebop.runlog` reads them) into one tidy table with a `run` column: that table is what a CSV download
holds, at full resolution. The figure function draws that table. Rates are pooled from counters
(`bebop.metrics`), never averaged over steps, and the entropy-law line is `bebop.metrics.fit_entropy_law`.

On screen each trace keeps at most MAX_POINTS points (evenly thinned, first and last kept), smoothing is a
TensorBoard-style debiased EMA over the full series drawn over a faint raw trace, and a run keeps its
colour across every figure of a page (`run_colors`).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bebop import metrics

MAX_POINTS = 1500
PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#EECA3B", "#9D755D",
           "#FF9DA6", "#BAB0AC")
ORIGIN_COLORS = {"accepted": "#2E9E5B", "recovered": "#E8833A", "bonus": "#3C78D8", "plain": "#9AA0A6"}
X_AXES = {"step": ("step", "RL step"), "time": ("time", "wall time (min)"), "tokens": ("tokens", "generated tokens")}
ACCEPT_LENGTH = "spec/accept_length"
TEMPLATE = "plotly_white"


# ---------------------------------------------------------------------------------------------- basics


def run_colors(runs: Iterable[str]) -> dict[str, str]:
    """One colour per run, by order: pass the page's run list so every figure agrees."""
    return {run: PALETTE[i % len(PALETTE)] for i, run in enumerate(dict.fromkeys(runs))}


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


def _layout(fig: go.Figure, title: str, x_title: str, y_title: str, height: int = 380) -> go.Figure:
    fig.update_layout(
        template=TEMPLATE, title=dict(text=title, x=0.01, xanchor="left"), height=height,
        margin=dict(l=60, r=20, t=50, b=40), hovermode="closest", uirevision="keep",
        # Below the axes: run names are long, and a legend on top fights the title for room.
        legend=dict(orientation="h", yanchor="top", y=-0.22, xanchor="left", x=0.0),
    )
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title)
    return fig


def _colors(runs: Sequence[str], given: Mapping[str, str] | None) -> dict[str, str]:
    """`given` colours, with unused palette colours for runs it does not cover (e.g. eval sub-series)."""
    colors = dict(given or {})
    spare = [c for c in PALETTE if c not in colors.values()] or list(PALETTE)
    for i, run in enumerate(r for r in runs if r not in colors):
        colors[run] = spare[i % len(spare)]
    return colors


def _runs(data: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(data["run"])) if len(data) else []


def _floats(column: pd.Series) -> np.ndarray:
    return np.array(column, dtype=float)  # a writable copy: torch refuses pandas' read-only views


def _check_columns(data: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    missing = [c for c in columns if c not in data.columns]
    if missing:
        raise ValueError(f"{what} needs columns {missing}; got {list(data.columns)}")


def pooled(train: pd.DataFrame) -> dict:
    """`metrics.pool` of every row, vectorised (column sums), so a long run stays cheap to redraw.

    Rows without MTP (no spec/gamma) are ignored; rows that disagree on γ or method cannot be pooled.
    """
    spec = train[train["spec/gamma"].notna()] if "spec/gamma" in train.columns else train.iloc[0:0]
    if spec.empty:
        raise ValueError("no speculative counters to pool (a run without MTP rollouts)")
    total = spec.select_dtypes("number").sum().to_dict()
    for key in ("spec/gamma", "spec/method"):
        values = spec[key].dropna().unique() if key in spec.columns else []
        if len(values) > 1:
            raise ValueError(f"cannot pool rows with different {key}: {list(values)}")
        if len(values):
            total[key] = values[0]
    total["spec/gamma"] = int(total["spec/gamma"])
    return metrics.pool([total])


# ------------------------------------------------------------------------ acceptance against entropy


def entropy_points(trains: Mapping[str, pd.DataFrame], *, by: str = "step") -> pd.DataFrame:
    """Points of the entropy law per run: [run, entropy, acceptance, weight].

    by="step": one point per RL step, accept length against the policy's mean entropy (PAPER Finding 1).
    by="bin": token level, pooled over the whole run: acceptance rate of the drafts in each entropy bin
    against the bin's mean entropy, weighted by how many drafts reached that bin.
    """
    if by not in ("step", "bin"):
        raise ValueError(f"by must be 'step' or 'bin', got {by!r}")
    frames = []
    for run, train in trains.items():
        if by == "step":
            if not {ACCEPT_LENGTH, "actor/entropy"} <= set(train.columns):
                continue
            part = pd.DataFrame({"entropy": train["actor/entropy"], "acceptance": train[ACCEPT_LENGTH],
                                 "weight": 1.0})
        else:
            if "spec/num_drafts" not in train.columns:
                continue
            h, a, n = metrics.binned_acceptance(pooled(train))
            part = pd.DataFrame({"entropy": h.numpy(), "acceptance": a.numpy(), "weight": n.numpy()})
        part = part.dropna()
        frames.append(part.assign(run=run)[["run", "entropy", "acceptance", "weight"]])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["run", "entropy", "acceptance", "weight"])


def token_points(tokens: Mapping[str, pd.DataFrame],
                 edges: Sequence[float] = metrics.ENTROPY_BIN_EDGES) -> pd.DataFrame:
    """The token-level law of evaluation runs (`tokens` streams: entropy, accepted 0/1 per reached draft).

    One series per run and (head, method) when those columns exist ("run · head method"), pooled over
    the rest (temperatures included: the entropy axis already tells them apart), one point per entropy bin.
    """
    frames = []
    for run, frame in tokens.items():
        if not {"entropy", "accepted"} <= set(frame.columns) or frame.empty:
            continue
        keys = [c for c in ("head", "method") if c in frame.columns]
        data = frame[[*keys, "entropy", "accepted"]].dropna()
        data = data.assign(bin=np.digitize(data["entropy"].to_numpy(dtype=float), np.asarray(edges[1:-1])))
        table = data.groupby([*keys, "bin"]).agg(entropy=("entropy", "mean"), acceptance=("accepted", "mean"),
                                                 weight=("accepted", "size")).reset_index()
        label = table[keys].astype(str).agg(" ".join, axis=1) if keys else pd.Series("", index=table.index)
        table["run"] = [f"{run} · {x}" if x else run for x in label]
        frames.append(table[["run", "entropy", "acceptance", "weight"]])
    columns = ["run", "entropy", "acceptance", "weight"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def entropy_fits(points: pd.DataFrame) -> pd.DataFrame:
    """The fitted law acceptance = intercept + slope·H per run: [run, slope, intercept, r2, n] (NaN: no fit)."""
    _check_columns(points, ("run", "entropy", "acceptance", "weight"), "entropy_fits")
    rows = []
    for run in _runs(points):
        part = points[points["run"] == run]
        try:
            fit = metrics.fit_entropy_law(_floats(part["entropy"]), _floats(part["acceptance"]),
                                          weights=_floats(part["weight"]), n_bootstrap=0)
            rows.append((run, fit.slope, fit.intercept, fit.r2, fit.n))
        except ValueError:  # fewer than 3 points, or no spread in entropy yet
            rows.append((run, math.nan, math.nan, math.nan, len(part)))
    return pd.DataFrame(rows, columns=["run", "slope", "intercept", "r2", "n"])


def acceptance_vs_entropy(points: pd.DataFrame, *, colors: Mapping[str, str] | None = None,
                          y_title: str = "accept length (tokens / verify step)") -> go.Figure:
    """Scatter per run with its fitted line; the legend gives slope (per nat) and R²."""
    fits = entropy_fits(points).set_index("run")
    colors = _colors(_runs(points), colors)
    fig = go.Figure()
    for run in _runs(points):
        part = points[points["run"] == run]
        keep = thin(len(part))
        weight = part["weight"].to_numpy(dtype=float)
        # Binned points are sized by how many drafts they pool; per-step points all weigh the same.
        size = 4 + 14 * np.sqrt(weight / weight.max()) if np.ptp(weight) > 0 else np.full(len(part), 7.0)
        fit = fits.loc[run]
        law = "too few points to fit" if math.isnan(fit["slope"]) else f"slope {fit['slope']:+.2f}/nat, R² {fit['r2']:.2f}"
        fig.add_trace(go.Scatter(
            x=part["entropy"].to_numpy()[keep], y=part["acceptance"].to_numpy()[keep], mode="markers",
            name=f"{run} · {law}", legendgroup=run, marker=dict(color=colors[run], size=size[keep], opacity=0.75, line=dict(width=0)),
            customdata=part["weight"].to_numpy()[keep],
            hovertemplate=f"<b>{html.escape(run)}</b><br>H %{{x:.3f}} nats<br>acceptance %{{y:.3f}}<br>weight %{{customdata:.0f}}<extra></extra>",
        ))
        if math.isnan(fit["slope"]):
            continue
        x = np.array([part["entropy"].min(), part["entropy"].max()])
        fig.add_trace(go.Scatter(
            x=x, y=fit["intercept"] + fit["slope"] * x, mode="lines", legendgroup=run, showlegend=False,
            name=f"{run} fit", line=dict(color=colors[run], width=2.5),
            hovertemplate=f"{html.escape(run)}: {law}<extra></extra>",
        ))
    return _layout(fig, "Acceptance vs entropy", "policy entropy H(p) (nats)", y_title, height=460)


# ---------------------------------------------------------------------------------- metrics over time


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
            fig.add_trace(go.Scatter(x=xs[keep], y=smooth(raw, smoothing)[keep], mode="lines",
                                     name=run if j == 0 else name, legendgroup=run, showlegend=j == 0, line=style,
                                     hovertemplate=f"{html.escape(name)}<br>%{{x}}: %{{y:.4g}}<extra></extra>"))
    if len(columns) > 1:
        for j, column in enumerate(columns):
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=(labels or {}).get(column, column),
                                     line=dict(color="#555", dash=dashes[j % len(dashes)], width=2)))
    return _layout(fig, title, X_AXES[x][1], y_title)


# ------------------------------------------------------------------------------------- pooled tables


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


# ----------------------------------------------------------------------------- Eq.-16 decomposition


def decomposition_data(trains: Mapping[str, pd.DataFrame], *, fit_fraction: float = 0.2) -> pd.DataFrame:
    """PAPER Eq. 16 per run: change of accept length since the start = entropy part + mismatch part."""
    frames = []
    for run, train in trains.items():
        if not {ACCEPT_LENGTH, "actor/entropy"} <= set(train.columns):
            continue
        part = train[["step", ACCEPT_LENGTH, "actor/entropy"]].dropna()
        try:
            dec = metrics.decompose_acceptance(_floats(part[ACCEPT_LENGTH]), _floats(part["actor/entropy"]),
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
    _check_columns(data, ("run", "step", "total", "entropy_part", "mismatch_part"), "decomposition_figure")
    parts = {"total": ("total Δ", "#333333", "solid"), "entropy_part": ("entropy part", "#4C78A8", "dash"),
             "mismatch_part": ("mismatch part", "#E45756", "dot")}
    runs = _runs(data)
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
    fig = _layout(fig, "Eq. 16: change in accept length = entropy part + mismatch part (x: RL step)", "", "",
                  height=170 + 230 * rows)
    fig.update_yaxes(title_text="Δ accept length", col=1)
    fig.update_layout(margin=dict(t=90), legend=dict(y=-0.1 if rows == 1 else -0.05))
    return fig


# ------------------------------------------------------------------------------------------ samples


def sample_tokens(sample: Mapping) -> pd.DataFrame:
    """A `samples` record as one row per generated token: [index, piece, origin, entropy]."""
    pieces, origin, entropy = sample.get("pieces"), sample.get("origin"), sample.get("entropy")
    if not isinstance(pieces, list) or not isinstance(origin, list) or not isinstance(entropy, list):
        raise ValueError("a sample needs list fields 'pieces', 'origin' and 'entropy'")
    if not len(pieces) == len(origin) == len(entropy):
        raise ValueError(f"pieces, origin and entropy differ in length: {len(pieces)}, {len(origin)}, {len(entropy)}")
    return pd.DataFrame({"index": range(len(pieces)), "piece": [str(p) for p in pieces],
                         "origin": [str(o) for o in origin], "entropy": pd.to_numeric(entropy, errors="coerce")})


def sample_html(tokens: pd.DataFrame) -> str:
    """The rollout's text, each token on a background of its origin's colour, entropy on hover."""
    _check_columns(tokens, ("piece", "origin", "entropy"), "sample_html")
    spans = []
    for piece, origin, h in tokens[["piece", "origin", "entropy"]].itertuples(index=False):
        color = ORIGIN_COLORS.get(origin, "#CCCCCC")
        text = html.escape(piece).replace("\n", "↵<br>")
        spans.append(f'<span title="{html.escape(origin)} · H = {h:.3f} nats" style="background:{color}33;'
                     f'border-bottom:3px solid {color};padding:1px 0;white-space:pre-wrap">{text}</span>')
    return '<div style="font-family:ui-monospace,monospace;font-size:0.95rem;line-height:2">' + "".join(spans) + "</div>"


def token_figure(tokens: pd.DataFrame) -> go.Figure:
    """Entropy of every generated token, coloured by where it came from (accepted / recovered / bonus / plain)."""
    _check_columns(tokens, ("index", "piece", "origin", "entropy"), "token_figure")
    fig = go.Figure()
    for origin, color in ORIGIN_COLORS.items():
        part = tokens[tokens["origin"] == origin]
        if len(part):
            fig.add_trace(go.Bar(x=part["index"], y=part["entropy"], name=origin, marker_color=color,
                                 customdata=part["piece"].map(repr),
                                 hovertemplate="token %{x} %{customdata}<br>H %{y:.3f} nats<extra>" + origin + "</extra>"))
    fig.update_layout(bargap=0.1)
    return _layout(fig, "Entropy per generated token, by origin", "token index", "H(p) (nats)", height=300)
