"""Figures: the traces users read are there, carry the data, respect the point budget, and fit correctly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from bebop import metrics, plots


def _train(steps: int, *, slope: float = -1.7, gamma: int = 3, spec: bool = True, seed: int = 0,
           gen_s: float = 2.0) -> pd.DataFrame:
    """A train stream with real counters: accept length ≈ 3.5 + slope·(H - 0.1) up to counting noise."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for step in range(steps):
        h = 0.1 + 0.5 * step / max(1, steps - 1)
        row = {"step": step, "time": 10.0 * step, "tokens": 1000 * step, "actor/entropy": h,
               "critic/score/mean": step / steps, "timing_s/gen": gen_s, "timing_s/update_actor": 1.0,
               "timing_s/step": gen_s + 1.0, "perf/throughput": 500.0}
        if spec:
            alpha = float(np.clip(0.95 + slope * 0.25 * (h - 0.1), 0.05, 0.99))
            c = metrics.SpecCounters(gamma, "rs")
            entropy = torch.full((64, gamma), h, dtype=torch.float64)
            passed = torch.rand(64, gamma, generator=gen, dtype=torch.float64) < alpha
            c.update(passed.long().cumprod(1).sum(1), entropy)
            row.update(c.to_dict())
            row.update(metrics.derive(row))
        rows.append(row)
    return pd.DataFrame(rows)


def _traces(fig, **match):
    return [t for t in fig.data if all(getattr(t, k) == v for k, v in match.items())]


def test_acceptance_vs_entropy_scatter_and_fit():
    trains = {"rs-ce": _train(40, slope=-1.7), "rs-tv": _train(40, slope=-0.1, seed=1), "plain": _train(5, spec=False)}
    points = plots.entropy_points(trains)
    assert set(points["run"]) == {"rs-ce", "rs-tv"}  # no acceptance without MTP
    fig = plots.acceptance_vs_entropy(points)
    for run in ("rs-ce", "rs-tv"):
        part = points[points["run"] == run]
        scatter = [t for t in fig.data if t.mode == "markers" and t.legendgroup == run][0]
        np.testing.assert_allclose(scatter.y, part["acceptance"])
        fit = metrics.fit_entropy_law(part["entropy"].to_numpy().copy(), part["acceptance"].to_numpy().copy(),
                                      n_bootstrap=0)
        line = _traces(fig, name=f"{run} fit")[0]
        drawn_slope = (line.y[1] - line.y[0]) / (line.x[1] - line.x[0])
        assert drawn_slope == pytest.approx(fit.slope)
        assert line.y[0] == pytest.approx(fit.intercept + fit.slope * line.x[0])
        assert f"slope {fit.slope:+.2f} [" in scatter.name and f"R² {fit.r2:.2f}" in scatter.name  # with its CI
    fits = plots.entropy_fits(points).set_index("run")
    assert (fits["slope_lo"] < fits["slope"]).all() and (fits["slope"] < fits["slope_hi"]).all()
    assert fits.loc["rs-ce", "slope"] < -1.0 < fits.loc["rs-tv", "slope"]  # the steep law and the flat one


def test_binned_points_are_weighted_by_reached_drafts():
    train = _train(20)
    points = plots.entropy_points({"r": train}, by="bin")
    pooled = metrics.pool(train.to_dict("records"))
    h, a, n = metrics.binned_acceptance(pooled)
    np.testing.assert_allclose(points["weight"], n.numpy())
    np.testing.assert_allclose(points["acceptance"], a.numpy())
    with pytest.raises(ValueError, match="by must be"):
        plots.entropy_points({"r": train}, by="token")


def test_too_few_points_draw_no_fit_line():
    points = plots.entropy_points({"new": _train(2)})
    fig = plots.acceptance_vs_entropy(points)
    assert len(fig.data) == 1 and "too few points" in fig.data[0].name


def test_downsampling_bound_keeps_the_ends():
    long = _train(5000, spec=False)
    data = plots.over_time({"r": long}, ["critic/score/mean"])
    fig = plots.lines(data, ["critic/score/mean"], title="Reward", y_title="reward", smoothing=0.5)
    assert len(fig.data) == 2
    for trace in fig.data:
        assert len(trace.x) <= plots.MAX_POINTS
        assert trace.x[0] == 0 and trace.x[-1] == 4999
    idx = plots.thin(10, 4)
    assert list(idx) == [0, 3, 6, 9]
    points = plots.entropy_points({"r": _train(3000)})
    assert len(plots.acceptance_vs_entropy(points).data[0].x) <= plots.MAX_POINTS


def test_the_data_are_bold_and_the_smoothed_trend_faint():
    values = np.array([1.0, 3.0, np.nan, 2.0])
    w = 0.5
    expected = [1.0, (0.5 * 1 + 3) / 1.5, (0.5 * 1 + 3) / 1.5, (0.25 * 1 + 0.5 * 3 + 2) / 1.75]
    np.testing.assert_allclose(plots.smooth(values, w), expected)
    with pytest.raises(ValueError, match="smoothing weight"):
        plots.smooth(values, 1.0)
    data = plots.over_time({"a": _train(30), "b": _train(30, seed=2)}, ["actor/entropy"], x="time")
    fig = plots.lines(data, ["actor/entropy"], title="Entropy", y_title="nats", x="time", smoothing=0.8)
    bold = [t for t in fig.data if t.hoverinfo != "skip"]
    faint = [t for t in fig.data if t.hoverinfo == "skip"]
    assert len(bold) == len(faint) == 2 and all(t.opacity < 0.5 and not t.showlegend for t in faint)
    assert all(t.opacity is None for t in bold)  # the data, fully opaque, in the legend
    for trace in bold:  # the bold line is the data: it ends at the last value logged, as the tables read it
        part = data[data["run"] == trace.name]
        np.testing.assert_allclose(trace.y, part["actor/entropy"])
    np.testing.assert_allclose(bold[0].x, np.arange(30) * 10 / 60)  # wall time in minutes
    assert fig.layout.xaxis.title.text == "wall time (min)"
    a, b = plots.run_colors(["a", "b"]).values()
    assert {t.line.color for t in fig.data} == {a, b}


def test_step_axes_have_whole_ticks_and_acceptance_starts_at_zero():
    data = plots.over_time({"a": _train(5)}, [plots.ACCEPT_LENGTH])
    fig = plots.lines(data, [plots.ACCEPT_LENGTH], title="Accept length", y_title="tokens", from_zero=True)
    assert fig.layout.xaxis.dtick == 1 and fig.layout.xaxis.tickformat == "d"  # not 0.2, 0.4, ...
    assert fig.layout.yaxis.rangemode == "tozero"
    long = plots.lines(plots.over_time({"a": _train(40)}, ["actor/entropy"]), ["actor/entropy"], title="H",
                       y_title="nats")
    assert long.layout.xaxis.dtick is None and long.layout.xaxis.tickformat == "d"  # Plotly's spacing, no decimals
    law = plots.acceptance_vs_entropy(plots.entropy_points({"a": _train(12)}))
    assert law.layout.yaxis.rangemode == "tozero" and "12 points" in law.data[0].name


def test_per_position_lines_and_pooled_bars():
    trains = {"r": _train(10)}
    columns = [f"spec/acceptance_rate_pos/{i}" for i in range(3)]
    fig = plots.lines(plots.over_time(trains, columns), columns, title="pos", y_title="rate")
    data_traces = [t for t in fig.data if t.x[0] is not None]
    assert len(data_traces) == 3 and {t.line.dash for t in data_traces} == {"solid", "dash", "dot"}
    table = plots.positions(trains)
    pooled = metrics.derive(metrics.pool(trains["r"].to_dict("records")))
    assert list(table["position"]) == [1, 2, 3]
    assert table["alpha"].iloc[1] == pytest.approx(pooled["spec/alpha_pos/1"])
    bars = plots.positions_figure(table).data
    assert len(bars) == 1 and list(bars[0].y) == pytest.approx(list(table["acceptance_rate"]))


def _with_engine(train: pd.DataFrame, *, steps: int, draft_s: float, verify_s: float) -> pd.DataFrame:
    """The engine's decode-loop counters on every row: `steps` verify steps costing these seconds each."""
    return train.assign(**{"engine/num_steps": steps, "engine/draft_s": steps * draft_s,
                           "engine/verify_s": steps * verify_s * 0.9, "engine/advance_s": steps * verify_s * 0.1})


def test_step_time_breakdown_and_speedup():
    trains = {"plain": _with_engine(_train(10, spec=False, gen_s=6.0), steps=90, draft_s=0.0, verify_s=0.02),
              "rs": _with_engine(_train(10, gen_s=2.0), steps=30, draft_s=0.012, verify_s=0.03)}
    times = plots.step_times(trains).set_index("run")
    assert times.loc["plain", "gen"] == 6.0 and times.loc["rs", "step"] == 3.0
    fig = plots.step_time_figure(times.reset_index())
    # Side by side, not stacked: async generation and update overlap, their sum is not the step.
    assert [t.name for t in fig.data] == ["generation", "update", "whole step"] and fig.layout.barmode == "group"
    table = plots.speedup_table(trains, {"rs": "plain"}).set_index("run")
    assert list(table.index) == ["rs"] and table.loc["rs", "plain_run"] == "plain"  # a plain run is no row
    assert table.loc["rs", "measured_end_to_end"] == pytest.approx(7.0 / 3.0)
    assert table.loc["rs", "measured_rollout"] == pytest.approx(3.0)
    assert table.loc["rs", "step_cost"] == pytest.approx((0.012 + 0.03) / 0.02)  # drafts + verify, in plain steps
    steady = trains["rs"].iloc[1:-1]
    tokens = 1 + steady["spec/num_accepted_tokens"].sum() / steady["spec/num_drafts"].sum()
    assert table.loc["rs", "predicted"] == pytest.approx(tokens / 2.1)
    assert table.loc["rs", "note"].startswith("measured 3.00x is")  # beyond its prediction: flagged
    bars = plots.speedup_figure(table.reset_index()).data
    assert [b.name for b in bars] == ["generation, measured", "whole step, measured",
                                      "generation, predicted from measured costs"]
    assert list(bars[0].x) == pytest.approx([3.0]) and bars[2].marker.pattern.shape == "/"


def test_no_prediction_without_logged_costs():
    trains = {"plain": _train(4, spec=False), "rs": _train(4)}
    row = plots.speedup_table(trains, {"rs": "plain"}).set_index("run").loc["rs"]
    assert np.isnan(row["step_cost"]) and np.isnan(row["predicted"]) and row["note"] == ""  # never a made-up one


def test_fitted_line_stays_above_zero():
    points = pd.DataFrame({"run": "r", "entropy": [0.1, 1.0, 2.0, 3.0], "acceptance": [0.9, 0.5, 0.1, 0.05],
                           "weight": [100.0, 50.0, 20.0, 5.0]})
    fit = plots.entropy_fits(points).iloc[0]
    assert fit["intercept"] + fit["slope"] * 3.0 < 0  # the raw line would cross zero inside the points' range
    line = _traces(plots.acceptance_vs_entropy(points), name="r fit")[0]
    assert min(line.y) == pytest.approx(0.0, abs=1e-12) and min(line.y) >= -1e-12
    assert line.x[0] == pytest.approx(0.1)


def test_partial_counters_name_the_missing_field():
    train = _train(3).drop(columns=["spec/gamma"])
    assert plots.missing_spec(train) == ["spec/gamma"] and not plots.has_spec(train)
    with pytest.raises(ValueError, match="lack spec/gamma"):
        plots.pooled(train)
    assert plots.positions({"r": train}).empty and plots.entropy_points({"r": train}, by="bin").empty


def test_short_series_draw_their_points():
    one = plots.lines(plots.over_time({"r": _train(1)}, ["actor/entropy"]), ["actor/entropy"], title="t", y_title="H")
    assert [t.mode for t in one.data] == ["lines+markers"]
    long = plots.lines(plots.over_time({"r": _train(200, spec=False)}, ["actor/entropy"]), ["actor/entropy"],
                       title="t", y_title="H")
    assert [t.mode for t in long.data] == ["lines"]


def test_legend_sits_below_the_axis_title():
    fig = plots.lines(plots.over_time({"r": _train(3)}, ["actor/entropy"]), ["actor/entropy"], title="t", y_title="H")
    assert fig.layout.legend.yref == "container" and fig.layout.legend.y == 0 and fig.layout.legend.yanchor == "bottom"
    assert fig.layout.margin.b >= 80  # room for the axis title above the legend


def test_numeric_series_lists_every_logged_number():
    series = plots.numeric_series({"a": _train(2), "b": pd.DataFrame({"step": [0], "mtp/loss/ce": [1.0]})})
    assert "mtp/loss/ce" in series and "actor/entropy" in series and "step" not in series


def test_decomposition_parts_sum_to_total():
    trains = {"a": _train(30), "b": _train(30, slope=-0.2, seed=3)}
    data = plots.decomposition_data(trains, fit_fraction=0.3)
    np.testing.assert_allclose(data["entropy_part"] + data["mismatch_part"], data["total"], atol=1e-12)
    fig = plots.decomposition_figure(data, smoothing=0.0)
    assert len([t for t in fig.data if t.name == "total Δ"]) == 2
    total_a = [t for t in fig.data if t.name == "total Δ"][0]
    np.testing.assert_allclose(total_a.y, data[data["run"] == "a"]["total"])
    assert plots.decomposition_data({"short": _train(2)}).empty  # too few steps: nothing, not an error


def test_sample_colouring_escapes_text():
    sample = {"pieces": ["<script>", " x", "\n"], "origin": ["plain", "accepted", "bonus"], "entropy": [0.5, 0.1, 2.0]}
    tokens = plots.sample_tokens(sample)
    page = plots.sample_html(tokens)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert plots.ORIGIN_COLORS["accepted"] in page and "H = 2.000 nats" in page
    fig = plots.token_figure(tokens)
    assert {t.name for t in fig.data} == {"plain", "accepted", "bonus"}
    with pytest.raises(ValueError, match="differ in length"):
        plots.sample_tokens({"pieces": ["a"], "origin": [], "entropy": []})


def test_token_points_from_an_evaluation_stream():
    gen = np.random.default_rng(0)
    h = gen.exponential(0.6, size=4000)
    rows = [{"head": head, "method": "rs", "temperature": 1.0, "pos": 0, "entropy": float(e),
             "accepted": int(gen.random() < (0.95 - slope * e))} for head, slope in (("ce", 0.3), ("e2e_tv", 0.02))
            for e in h]
    points = plots.token_points({"eval": pd.DataFrame(rows)})
    assert set(points["run"]) == {"eval · ce rs", "eval · e2e_tv rs"}
    ce = points[points["run"] == "eval · ce rs"]
    assert ce["weight"].sum() == 4000
    in_first_bin = h < metrics.ENTROPY_BIN_EDGES[1]
    assert ce["weight"].iloc[0] == in_first_bin.sum()
    assert ce["entropy"].iloc[0] == pytest.approx(h[in_first_bin].mean())
    fits = plots.entropy_fits(points).set_index("run")
    assert fits.loc["eval · ce rs", "slope"] < -0.15 < fits.loc["eval · e2e_tv rs", "slope"]
    fig = plots.acceptance_vs_entropy(points, colors={"other": plots.PALETTE[0]})
    assert len({t.marker.color for t in fig.data if t.mode == "markers"} | {plots.PALETTE[0]}) == 3


def test_vectorised_pooling_matches_metrics_pool():
    train = _train(25)
    reference = metrics.pool(train.to_dict("records"))
    fast = plots.pooled(pd.concat([train, _train(3, spec=False)], ignore_index=True))  # plain rows are ignored
    assert fast.keys() == reference.keys()
    for key, value in reference.items():
        assert fast[key] == (value if isinstance(value, str) else pytest.approx(value))
    with pytest.raises(ValueError, match="different spec/gamma"):
        plots.pooled(pd.concat([train, _train(3, gamma=2)], ignore_index=True))
    with pytest.raises(ValueError, match="no speculative counters"):
        plots.pooled(_train(3, spec=False))


def test_row_depths_and_budgets_from_a_rollouts_counters():
    from bebop.plots.row_depths import budget_figure, budgets, row_depth_figure, row_depths

    train = pd.DataFrame({"step": [1, 2], "spec/num_row_depth/0": [6, 0], "spec/num_row_depth/1": [2, 4],
                          "spec/num_row_depth/3": [0, 4], "spec/num_budget_tokens": [10, 24],
                          "engine/num_row_steps": [8, 8], "spec/num_lookup_row_steps": [2, 0],
                          "engine/priced_steps/predicted_s": [1.0, 2.0], "engine/priced_steps/measured_s": [1.1, 1.8]})
    depths = row_depths({"r": train, "plain": pd.DataFrame({"step": [1]})})
    assert set(depths["run"]) == {"r"}
    shares = depths.pivot(index="step", columns="depth", values="share")
    assert shares.loc[1].tolist() == [0.75, 0.25, 0.0] and shares.loc[2].tolist() == [0.0, 0.5, 0.5]
    table = budgets({"r": train})
    assert table["budget_per_row"].tolist() == [1.25, 3.0] and table["lookup_share"].tolist() == [0.25, 0.0]
    assert len(row_depth_figure(depths).data) == 3 and len(budget_figure(table).data) == 1
