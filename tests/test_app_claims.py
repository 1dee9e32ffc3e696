"""What the dashboard claims is what its numbers support (Streamlit AppTest, as tests/test_app.py): the Shadow heads
page with each head's law, its flags and within-cluster slope; the Speed page crediting a whole-step gain to what
caused it; synthetic runs marked and kept apart from real ones; draft-health alarms as the current monitor reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from bebop import speedup  # noqa: E402
from bebop.plots.shadow import AS_DRAFTED  # noqa: E402
from bebop.rl.shadow_report import shadow_summary  # noqa: E402
from bebop.runlog import RunWriter  # noqa: E402
from bebop.runlog.setup import rl_setup  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ENTRY = REPO / "app" / "main.py"
VIEWS = REPO / "bebop" / "app" / "views"
POLICY = {"name": "default", "hash": "0123abcd", "dtype": "float32", "parameters": 3_500_000}


def _app(root: Path, monkeypatch, selected: list[str] | None, page: str | None = None) -> AppTest:
    monkeypatch.setenv("BEBOP_RUNS", str(root))
    at = AppTest.from_file(str(ENTRY), default_timeout=90)
    if selected is not None:
        at.session_state["runs_selected"] = selected
    at.run()
    return at if page is None else at.switch_page(str(VIEWS / f"{page}.py")).run()


def _texts(elements) -> str:
    return " ".join(str(e.value) for e in elements)


def _charts(at: AppTest) -> list[dict]:
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def _rl_run(path: Path, *, rollout: str, records: list[dict], shadow: list[dict] = ()) -> Path:
    """An RL run as `bebop rl` lays it out (8 prompts x 4 per step, the tiny policy), with the given records."""
    config = {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 96, "temperature": 1.0, "mode": "sync",
              "rollout": rollout}
    setup = rl_setup(task="math", rollout=rollout, mode="sync", mtp_objective="e2e_tv", mtp_strategy="frozen",
                     gamma=3)
    with RunWriter(path, config, kind="rl", meta_extra={**setup, "policy": POLICY,
                                                        "head": None if rollout == "none" else {"name": "e2e_tv"}}) as w:
        for record in records:
            w.log("train", record)
        for record in shadow:
            w.log("shadow", record)
    return path


def _step(step: int, *, gen: float, update: float, length: float, spec: bool) -> dict:
    record = {"step": step, "timing_s/gen": gen, "timing_s/update_actor": update, "timing_s/step": gen + update,
              "perf/throughput": 32 * length / gen, "response_length/mean": length, "critic/score/mean": 0.5,
              "actor/entropy": 0.3, "critic/groups_with_signal": 0.5}
    if spec:
        record.update({"spec/gamma": 3, "spec/method": "rs", "spec/num_drafts": 100, "spec/num_draft_tokens": 300,
                       "spec/num_accepted_tokens": 150})
    return record


def test_speed_page_notes_an_end_to_end_gain_beyond_generation(tmp_path, monkeypatch):
    """The MTP run generates slower than plain (0.95x) but its update ran faster (0.90 s against 1.05 s), so its whole
    step is 1.05x: the page says the gain came from outside generation, with the update's numbers, beside a table
    that holds seconds per step and tokens per second, both by the one named statistic."""
    root = tmp_path / "runs"
    _rl_run(root / "plain", rollout="none",
            records=[_step(s, gen=1.00, update=1.05, length=40.0, spec=False) for s in range(6)])
    _rl_run(root / "mtp", rollout="rs",
            records=[_step(s, gen=1.05, update=0.90, length=40.0, spec=True) for s in range(6)])
    at = _app(root, monkeypatch, ["plain", "mtp"], "speed")
    assert not at.exception, at.exception
    notes = _texts(at.warning)
    assert "`mtp`: end to end 1.05x exceeds generation's 0.95x, so all of the whole step's gain came from outside " \
           "generation: the update ran 0.90 s against the plain run's 1.05 s (1.17x)" in notes
    table = next(frame.value for frame in at.dataframe if "plain_run" in frame.value.columns).set_index("run")
    assert table.loc["mtp", "measured_end_to_end"] > table.loc["mtp", "measured_rollout"]
    times = next(frame.value for frame in at.dataframe if "tokens_per_s" in frame.value.columns).set_index("run")
    assert float(times.loc["mtp", "tokens_per_s"]) == pytest.approx(32 * 40 / 1.05, rel=1e-3)  # beside s / step
    assert speedup.STATISTIC in _texts(at.caption)


def test_answers_of_another_length_are_said_beside_the_speedup(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    _rl_run(root / "plain", rollout="none",
            records=[_step(s, gen=1.0, update=1.0, length=40.0, spec=False) for s in range(6)])
    _rl_run(root / "mtp", rollout="rs", records=[_step(s, gen=0.8, update=1.0, length=35.6, spec=True)
                                                 for s in range(6)])
    at = _app(root, monkeypatch, ["plain", "mtp"], "speed")
    assert "its answers were 11% shorter than the plain run's (median), so part of each ratio is less work, not " \
           "faster decoding" in _texts(at.warning)
    assert "exceeds generation" not in _texts(at.warning)  # the whole step gained less than generation did


def test_one_step_time_statistic_on_live_and_compare(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    records = [_step(s, gen=1.0 + (s == 5) * 9, update=1.0, length=40.0, spec=True) for s in range(6)]  # a slow last
    _rl_run(root / "mtp", rollout="rs", records=records)
    expected = speedup.step_stats(records)["step_s"]  # the median over steady steps: 2.0, not the last step's 11
    live = _app(root, monkeypatch, ["mtp"], "live")
    assert float(live.dataframe[0].value.set_index("run").loc["mtp", speedup.STEP_TIME]) == pytest.approx(expected)
    compare = _app(root, monkeypatch, ["mtp"], "compare")
    assert float(compare.dataframe[0].value.set_index("run").loc["mtp", "step_s"]) == pytest.approx(expected)


def _shadow_records(steps: int = 24) -> tuple[list[dict], list[dict]]:
    """A learning run's streams: entropy at 0.05-0.5 nats for most steps and 1.5-2.0 for the first four (a policy
    that sharpened fast); TO's accept length 4.4 - 1.0·H inside the main cluster and far below it outside."""
    train, shadow = [], []
    for step in range(steps):
        h = 1.5 + 0.5 * step / 3 if step < 4 else 0.05 + 0.45 * (step - 4) / (steps - 5)
        to = 2.0 if step < 4 else 4.4 - 1.0 * h + 0.05 * ((step * 7) % 5 - 2)
        train.append({**_step(step, gen=1.0, update=1.0, length=30.0, spec=True), "spec/accept_length": 2.5,
                      "spec/num_gamma_chosen/2": 10.0, "spec/num_gamma_chosen/3": 30.0})
        for head, rule, value in (("rollout", "to", to), ("rollout", "rs", to + 0.2), ("ce", "rs", to + 0.1)):
            shadow.append({"step": step, "head": head, "rule": rule, "strategy": "frozen", "entropy_mean": h,
                           "accept_length": value, "spec/gamma": 5})
    return train, shadow


def test_shadow_heads_page_shows_every_head_its_flagged_law_and_the_rollout_as_drafted(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    train, shadow = _shadow_records()
    run = _rl_run(root / "learn", rollout="rs", records=train, shadow=shadow)
    at = _app(root, monkeypatch, ["learn"], "shadow")
    assert not at.exception, at.exception
    assert at.title[0].value == "Shadow heads"
    assert "at γ = 5" in _texts(at.caption) and "(mean γ 2.8)" in _texts(at.caption)  # scored vs drafted depth
    expected = shadow_summary(run).set_index(["head", "rule"])
    lines = [line for line in _texts(at.markdown).split("\n") if " · " in line and "per nat" in line]
    assert len(lines) == 3 and [line.split("**")[1] for line in lines] == [f"{h} · {r}" for h, r in expected.index]
    line = next(line for line in lines if "**rollout · to**" in line)
    within = expected.loc[("rollout", "to")]
    assert f"{within['slope']:+.2f} [{within['slope_lo']:+.2f}, {within['slope_hi']:+.2f}] per nat" in line
    assert "2 separated clusters (20 at 0.05-0.50 nats" in line
    assert f"within the largest, {within['within_slope']:+.2f} [{within['within_slope_lo']:+.2f}, " in line
    assert abs(within["within_slope"] - -1.0) < 0.1 and within["slope"] < -1.2  # the gap steepens the line
    charts = _charts(at)
    legend = [t["name"] for t in charts[0]["data"] if t.get("mode") == "markers"]
    assert any(name.startswith("rollout · to · slope") and "⚠ flagged" in name for name in legend)
    assert any(t.get("line", {}).get("dash") == "dash" for t in charts[0]["data"])  # the within line, drawn
    assert AS_DRAFTED in [t["name"] for t in charts[1]["data"]]  # the rollout as drafted, labelled as such
    assert charts[2]["layout"]["title"]["text"].startswith("Start and end of the run")
    drift = at.table[0].value.set_index(["head", "rule"])
    assert drift.loc[("ce", "rs"), "start [95%]"].startswith(f"{expected.loc[('ce', 'rs'), 'start']:.2f} [")


def test_all_metrics_draws_the_shadow_stream_one_line_per_head_and_rule(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    train, shadow = _shadow_records()
    _rl_run(root / "learn", rollout="rs", records=train, shadow=shadow)
    at = _app(root, monkeypatch, ["learn"], "metrics")
    at.selectbox(key="metrics_stream").set_value("shadow").run()
    at.multiselect(key="metrics_series_shadow").set_value(["accept_length"]).run()
    names = {t["name"] for t in _charts(at)[0]["data"]}
    assert {"learn · rollout · to", "learn · rollout · rs", "learn · ce · rs"} <= names  # no sawtooth through all


def test_synthetic_runs_are_marked_and_never_shown_or_paired_beside_real_runs_by_default(tmp_path, monkeypatch,
                                                                                          capsys):
    from reference_run import NAME, packed_root

    from bebop.cli import main

    monkeypatch.setenv("BEBOP_REFERENCE_RUNS", str(packed_root()))
    root = tmp_path / "preview"
    assert main(["preview", str(root), "--steps", "3"]) == 0
    assert f"open them: bebop dashboard --runs {root}" in capsys.readouterr().out
    at = _app(root, monkeypatch, None)
    assert at.sidebar.multiselect(key="runs_selected").value == [f"reference/{NAME}"]  # the real run alone
    assert at.title[0].value == "Runs :orange-badge[synthetic runs shown]"  # the Runs page lists every run
    assert "rs-e2e_tv (synthetic)" in set(at.dataframe[0].value["run"])
    live = _app(root, monkeypatch, ["rs-e2e_tv (synthetic)", "no-mtp (synthetic)"], "live")
    assert "synthetic runs shown" in live.title[0].value
    assert "SYNTHETIC: simulated by `bebop preview`" in _texts(live.caption)
    legend = [t["name"] for c in _charts(live) for t in c["data"] if t.get("name")]
    assert legend and all("(synthetic)" in name for name in legend if "rs-e2e_tv" in name or "no-mtp" in name)
    real = {"kind": "rl", "policy": POLICY, "config": {"prompts_per_step": 8, "group_size": 4}}
    assert "origin" in speedup.differences({**real, "synthetic": True}, real)  # never a synthetic run's partner
    assert speedup.differences(real, dict(real)) == []


def test_draft_health_alarms_are_read_by_the_current_monitor(tmp_path, monkeypatch):
    """A run whose stored alarm blamed the head for accepting more than the law (what an older monitor wrote): the
    pages replay the monitor over its counters, which calls no stretch of steps off the law here, so the stale text
    is not shown; the Speed page's health chart is the replay's."""
    root = tmp_path / "runs"
    train, _ = _shadow_records()
    for record in train:
        record.update({"spec/by_entropy/0/num_draft_tokens": 200.0, "spec/by_entropy/0/num_accepted_tokens": 150.0,
                       "spec/by_entropy/0/entropy_sum": 20.0, "spec/by_entropy/2/num_draft_tokens": 100.0,
                       "spec/by_entropy/2/num_accepted_tokens": 50.0, "spec/by_entropy/2/entropy_sum": 60.0})
    run = _rl_run(root / "learn", rollout="rs", records=train)
    with RunWriter(run, {}, kind="rl", resume=True) as writer:
        writer.warn("draft health: acceptance 0.847 vs 0.657 predicted: a stale or corrupt head?",
                    source="draft_health", step=12)
    at = _app(root, monkeypatch, ["learn"])
    assert "stale or corrupt" not in _texts(at.warning)
    live = _app(root, monkeypatch, ["learn"], "live")
    assert not live.exception and "stale or corrupt" not in _texts(live.warning)
    speed = _app(root, monkeypatch, ["learn"], "speed")
    health = [c for c in _charts(speed) if c["layout"]["title"]["text"].startswith("Draft health")]
    assert health and not any("#E45756" in str(t.get("marker", {}).get("color")) for t in health[0]["data"])
