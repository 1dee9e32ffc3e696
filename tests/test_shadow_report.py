"""Reading a shadow stream back (bebop.rl.shadow_report): the entropy law per head and rule over RL steps, and the
acceptance at start and end with intervals, on streams whose answers are known."""

import pandas as pd
import pytest
import torch

from bebop import plots
from bebop.rl.shadow_report import paired_slopes, rule_slope_ratio, shadow_points, shadow_summary
from bebop.rl.shadow_score import counters_record, expected_counters
from bebop.runlog import RunWriter


def law_stream(steps: int = 20) -> pd.DataFrame:
    """Per step: entropy rising 0.1 -> 0.6 nats; TO's accept length 3.6 - 1.5·H, RS's flat at 3.4, each with seeded
    noise of SD 0.02."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for step in range(steps):
        h = 0.1 + 0.5 * step / (steps - 1)
        for rule, value in (("to", 3.6 - 1.5 * h), ("rs", 3.4)):
            noise = 0.02 * float(torch.randn((), generator=g))
            rows.append({"step": step, "head": "e2e_tv", "rule": rule, "strategy": "frozen", "entropy_mean": h,
                         "accept_length": value + noise})
    return pd.DataFrame(rows)


def test_the_law_per_head_and_rule_recovers_the_slopes_with_intervals():
    table = shadow_summary(law_stream()).set_index("rule")
    to, rs = table.loc["to"], table.loc["rs"]
    assert to["slope_lo"] < -1.5 < to["slope_hi"] and to["slope_hi"] < -1.3 and to["r2"] > 0.95
    assert rs["slope_lo"] < 0 < rs["slope_hi"] and abs(rs["slope"]) < 0.1  # flat: the interval holds 0
    assert to["points"] == rs["points"] == 20 and (table["head"] == "e2e_tv").all()


def test_start_and_end_are_window_means_with_bootstrap_intervals():
    table = shadow_summary(law_stream(), window=5).set_index("rule")
    to, rs = table.loc["to"], table.loc["rs"]
    frame = law_stream()
    first = frame[(frame["rule"] == "to") & (frame["step"] < 5)]["accept_length"].mean()
    assert to["start"] == pytest.approx(first) and to["window"] == 5
    assert to["start_lo"] < to["start"] < to["start_hi"]
    # TO falls by 1.5 x 0.4 nats between the windows' mean entropies: outside its interval; RS does not move
    assert to["change_hi"] < -0.5 and to["relative_change"] == pytest.approx(to["end"] / to["start"] - 1)
    assert rs["change_lo"] < 0 < rs["change_hi"] and abs(rs["relative_change"]) < 0.01
    assert to["entropy_end"] - to["entropy_start"] == pytest.approx(0.5 * 15 / 19)
    short = shadow_summary(law_stream(steps=3), window=10)  # at most half the run per window
    assert (short["window"] == 1).all() and short["start_lo"].isna().all() and short["slope"].notna().all()


def test_the_token_level_law_pools_the_bins_over_the_run(tmp_path):
    """One draft position (γ = 1) whose α = 0.9 - 0.3·H exactly: each bin's pooled acceptance is the law at the bin's
    mean entropy, so the binned fit is the law itself; the stream is read from a run directory."""
    g = torch.Generator().manual_seed(1)
    with RunWriter(tmp_path / "run", {}, kind="rl") as writer:
        for step in range(4):
            h = torch.rand(200, 1, generator=g) * 2.5  # [M, 1]
            record = counters_record(expected_counters(0.9 - 0.3 * h, h), 1, "rs")
            writer.log("shadow", {"step": step, "head": "tv", "rule": "rs", "strategy": "online-tv", **record})
    points = shadow_points(tmp_path / "run", by="bin")
    assert (points["run"] == "tv · rs").all() and len(points) == 10 and points["step"].isna().all()
    row = shadow_summary(tmp_path / "run", by="bin").iloc[0]
    assert row["slope"] == pytest.approx(-0.3, rel=1e-6) and row["r2"] == pytest.approx(1.0)
    assert row["strategy"] == "online-tv" and row["start"] == pytest.approx(row["end"], abs=0.05)
    figure = plots.acceptance_vs_entropy(points)
    assert "slope -0.30 [-0.30, -0.30]/nat" in figure.data[0].name


def test_a_run_without_shadow_heads_is_one_clear_error(tmp_path):
    with RunWriter(tmp_path / "run", {}, kind="rl") as writer:
        writer.log("train", {"step": 0})
    with pytest.raises(ValueError, match="without --shadow-heads"):
        shadow_summary(tmp_path / "run")
    with pytest.raises(ValueError, match="no per-step"):
        shadow_points(law_stream(), value="speed")


def test_rs_over_to_slope_ratio_with_a_paired_interval():
    """RS falls 0.15 per nat where TO falls 1.5: the ratio is 0.1, inside its interval; a flat RS gives about 0."""
    frame = law_stream(steps=30)
    steep = frame.assign(accept_length=frame["accept_length"] - 0.15 * frame["entropy_mean"] * (frame["rule"] == "rs"))
    got = rule_slope_ratio(steep, head="e2e_tv")
    assert got["ratio"] == pytest.approx(got["rs_slope"] / got["to_slope"])
    assert got["ratio_lo"] < 0.1 < got["ratio_hi"] and got["ratio_hi"] - got["ratio_lo"] < 0.15
    assert got["steps"] == 30 and got["entropy_min"] == pytest.approx(0.1)
    flat = rule_slope_ratio(frame, head="e2e_tv")
    assert flat["ratio_lo"] < 0 < flat["ratio_hi"] and abs(flat["ratio"]) < 0.05
    with pytest.raises(ValueError, match="not scored under TO"):
        rule_slope_ratio(frame[frame["rule"] == "rs"], head="e2e_tv")


def test_two_heads_under_rs_compared_along_the_steps_with_paired_intervals():
    """Finding 3 along a run: a CE head 0.3 below the TV head and falling 0.8 per nat under RS where the TV head is
    flat; the slope and level differences come out inside their intervals, which exclude 0, and a head compared
    with itself differs by exactly 0."""
    frame = law_stream(steps=30)
    rs = frame[frame["rule"] == "rs"]
    ce = rs.assign(head="ce", accept_length=rs["accept_length"] - 0.3 - 0.8 * (rs["entropy_mean"] - 0.1))
    both = pd.concat([frame, ce])
    got = paired_slopes(both, ("e2e_tv", "rs"), ("ce", "rs"))
    assert got["slope_diff"] == pytest.approx(got["a_slope"] - got["b_slope"])
    assert got["slope_diff_lo"] < 0.8 < got["slope_diff_hi"] and got["slope_diff_lo"] > 0.6
    assert got["level_diff_lo"] < 0.3 + 0.8 * 0.25 < got["level_diff_hi"] and got["level_diff_lo"] > 0.4
    same = paired_slopes(both, ("ce", "rs"), ("ce", "rs"))
    assert same["slope_diff"] == same["slope_diff_lo"] == same["slope_diff_hi"] == 0 and same["ratio"] == 1
