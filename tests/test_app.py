"""Every dashboard page under streamlit's AppTest, against synthetic runs (torn, corrupt, empty included) and one-step
runs made by the real `bebop rl`, `train-mtp` and `eval-mtp` commands (tests/real_runs.py)."""

from __future__ import annotations

import argparse
import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from bebop import speedup  # noqa: E402
from bebop.commands import dashboard  # noqa: E402
from bebop.default import DEFAULT_DIR, load_default  # noqa: E402
from bebop.models.checkpoint import weights_hash  # noqa: E402
from bebop.rl import synthetic  # noqa: E402
from bebop.rl.synthetic import SyntheticConfig  # noqa: E402
from bebop.runlog import RunWriter  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ENTRY = REPO / "app" / "main.py"
VIEWS = REPO / "bebop" / "app" / "views"
PAGES = ("live", "speed", "compare", "samples")


def measured(run_dir: Path) -> Path:
    """A synthetic run marked as a measured one: these tests read the pages as they show real runs (how synthetic
    runs are marked and kept apart: tests/test_app_claims.py)."""
    meta = json.loads((run_dir / "meta.json").read_text())
    meta.pop("synthetic", None)
    (run_dir / "meta.json").write_text(json.dumps(meta))
    return run_dir


def write_synthetic_run(path: Path, config: SyntheticConfig, **kwargs) -> Path:
    return measured(synthetic.write_synthetic_run(path, config, **kwargs))


def SyntheticRun(path: Path, config: SyntheticConfig) -> synthetic.SyntheticRun:  # noqa: N802 (stands in for the class)
    run = synthetic.SyntheticRun(path, config)
    measured(path)
    return run


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    small = dict(steps=14, drafts_per_step=24, samples_per_step=1, sample_tokens=16)
    write_synthetic_run(root / "plain", SyntheticConfig(name="plain", rollout="none", mtp_objective=None,
                                                        mtp_strategy=None, seed=1, **small))
    write_synthetic_run(root / "rs-tv", SyntheticConfig(name="rs-tv", seed=2, **small))
    torn = write_synthetic_run(root / "rs-ce", SyntheticConfig(name="rs-ce", mtp_objective="ce", seed=3, **small),
                               state="running")
    with open(torn / "train.jsonl", "ab") as f:  # a writer caught mid-line
        f.write(b'{"step": 14, "spec/gamma": 3, "spec/num_dr')
    corrupt = write_synthetic_run(root / "group" / "corrupt", SyntheticConfig(name="corrupt", seed=4, **small))
    lines = (corrupt / "train.jsonl").read_bytes().splitlines(keepends=True)
    (corrupt / "train.jsonl").write_bytes(b"".join(lines[:5] + [b"{garbage\n"] + lines[5:]))
    RunWriter(root / "empty", {"task": "code", "rollout": "rs"})  # started, nothing logged yet
    with RunWriter(root / "eval", {"temperatures": [0.6, 1.0]}, kind="eval-mtp") as w:
        for i in range(200):
            w.log("tokens", {"temperature": 1.0, "head": "ce", "method": "rs", "pos": i % 3,
                             "entropy": (i % 40) / 20, "accepted": int(i % 40 < 28)})
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _app(root: Path, monkeypatch, selected: list[str] | None) -> AppTest:
    monkeypatch.setenv("BEBOP_RUNS", str(root))
    at = AppTest.from_file(str(ENTRY), default_timeout=60)
    if selected is not None:
        at.session_state["runs_selected"] = selected
    return at.run()


def _page(at: AppTest, name: str) -> AppTest:
    return at.switch_page(str(VIEWS / f"{name}.py")).run()


def _charts(at: AppTest) -> list[dict]:
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def _n(values) -> int:
    """Points in a trace's x, as Plotly's JSON carries them (a list, or a base64 typed array)."""
    if isinstance(values, dict) and "bdata" in values:
        return len(np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]))
    return len(values)


def _speedups(at: AppTest):
    """The Speed page's speedup table (its step-time table comes first)."""
    return next(frame.value for frame in at.dataframe if "plain_run" in frame.value.columns)


def _texts(elements) -> str:
    return " ".join(str(e.value) for e in elements)


def test_runs_page_lists_every_run(root, monkeypatch):
    before = _snapshot(root)
    at = _app(root, monkeypatch, None)
    assert not at.exception
    assert at.title[0].value == "Runs"
    table = at.dataframe[0].value
    assert set(table["run"]) == {"plain", "rs-tv", "rs-ce", "group/corrupt", "empty", "eval"}
    assert set(table.set_index("run").loc[["plain", "rs-ce"], "state"]) == {"finished", "running"}
    assert table.set_index("run").loc["rs-tv", "mtp_objective"] == "e2e_tv"
    ages = table.set_index("run")["heartbeat_age_s"]  # a heartbeat only for a run still writing
    assert ages["plain"] == "—" and ages["rs-ce"].endswith(" s")
    assert len(at.get("download_button")) >= 1 and len(at.expander) == 6
    assert {m.label for m in at.metric} == {"running", "finished", "failed", "stale"}
    assert at.sidebar.text_input(key="runs_root").value == str(root)
    chosen = at.sidebar.multiselect(key="runs_selected").value
    assert set(chosen[:2]) == {"rs-ce", "empty"} and len(chosen) == 5  # running runs come first
    assert _snapshot(root) == before  # the app never writes into run directories


def test_live_page(root, monkeypatch):
    before = _snapshot(root)
    at = _page(_app(root, monkeypatch, ["rs-tv", "rs-ce", "plain", "group/corrupt", "empty", "eval"]), "live")
    assert not at.exception
    assert at.title[0].value == "Live"
    at.segmented_control(key="live_by").set_value("step").run()
    charts = _charts(at)
    titles = [c["layout"]["title"]["text"] for c in charts]
    assert titles[:2] == ["Acceptance vs entropy", "Accept length (at the depth the engine chose)"]
    assert {"Acceptance per draft position", "Policy entropy", "Reward"} <= set(titles)
    scatter = [t for t in charts[0]["data"] if t["mode"] == "markers"]
    steps = {t["legendgroup"]: _n(t["x"]) for t in scatter}
    assert steps["rs-tv"] == 14 and steps["rs-ce"] == 14  # the torn 15th line is not read yet
    assert steps["group/corrupt"] == 14  # the corrupt line is skipped, the rest kept
    assert "plain" not in steps
    assert not any(" · " in run for run in steps)  # per step the y axis is accept length: no eval rates mixed in
    at.segmented_control(key="live_by").set_value("bin").run()
    binned = {t["legendgroup"] for t in _charts(at)[0]["data"] if t["mode"] == "markers"}
    assert {"rs-tv", "eval · ce rs"} <= binned  # per entropy bin, an evaluation run's per-token law joins
    assert _charts(at)[0]["layout"]["yaxis"]["title"]["text"].startswith("acceptance rate")
    assert "skipped 1 corrupt line" in _texts(at.warning)
    assert "No data logged yet" in _texts(at.info) and "`empty`" in _texts(at.info)
    assert "`eval`" not in _texts(at.info)
    assert len(at.get("download_button")) == len(charts)
    headline = at.dataframe[0].value.set_index("run")
    assert headline.loc["rs-ce", "step"] == "13" and headline.loc["rs-ce", "state"] == "running"  # "—" for "empty"
    assert headline.loc["plain", "accept length (last 10)"] == "—"  # a run without MTP: a dash, never None or nan
    assert not headline.isna().any().any() and "None" not in headline.to_string()
    assert at.toggle(key="live_paused").value is False
    assert _snapshot(root) == before


def test_live_page_follows_a_growing_run(root, monkeypatch, tmp_path):
    grow = tmp_path / "grow"
    shutil.copytree(root / "rs-tv", grow / "rs-tv")
    at = _page(_app(grow, monkeypatch, ["rs-tv"]), "live")
    at.segmented_control(key="live_by").set_value("step").run()
    first = _n([t for t in _charts(at)[0]["data"] if t["mode"] == "markers"][0]["x"])
    lines = (grow / "rs-tv" / "train.jsonl").read_bytes().splitlines(keepends=True)
    with open(grow / "rs-tv" / "train.jsonl", "ab") as f:
        f.write(lines[-1].replace(b'"step":13', b'"step":14'))
    at.run()
    assert _n([t for t in _charts(at)[0]["data"] if t["mode"] == "markers"][0]["x"]) == first + 1
    shutil.rmtree(grow / "rs-tv")  # deleted while open
    at.run()
    assert not at.exception
    assert "deleted or moved" in _texts(at.sidebar.warning) and "rs-tv" in _texts(at.sidebar.warning)


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "train.jsonl").read_text().splitlines() if line.startswith("{")]


def test_speed_page(root, monkeypatch):
    at = _page(_app(root, monkeypatch, ["plain", "rs-tv", "rs-ce"]), "speed")
    assert not at.exception and at.title[0].value == "Speed"
    titles = [c["layout"]["title"]["text"] for c in _charts(at)]
    assert titles[0] == "Throughput" and titles[1].startswith("Step time")
    assert titles[2] == "Speedup over plain decoding at the same workload"
    assert speedup.STATISTIC in _texts(at.caption)  # the statistic is named on the page
    table = _speedups(at).set_index("run")
    assert dict(table["plain_run"]) == {"rs-tv": "plain", "rs-ce": "plain"}  # the plain run is no row of its own
    expected = speedup.speedup(_records(root / "plain"), _records(root / "rs-tv"))
    assert table.loc["rs-tv", "measured_rollout"] == pytest.approx(expected.rollout)
    assert table.loc["rs-tv", "predicted"] == pytest.approx(expected.predicted) and expected.predicted > 1.0
    assert len(at.get("download_button")) == 4  # throughput, step times, speedups, draft health (replayed)


def test_speed_partner_is_found_when_not_selected(root, monkeypatch):
    at = _page(_app(root, monkeypatch, ["rs-tv", "rs-ce"]), "speed")
    assert not at.exception
    assert set(_speedups(at)["plain_run"]) == {"plain"}
    assert "`plain` (not selected) is the plain partner of `rs-tv`, `rs-ce`" in _texts(at.caption)


def test_a_run_of_another_policy_gets_no_ratio(root, monkeypatch, tmp_path):
    """A lone run of another model (its meta names its policy) is never divided by the tiny policy's plain run."""
    other = tmp_path / "runs"
    shutil.copytree(root / "plain", other / "plain")
    shutil.copytree(root / "rs-tv", other / "smol-rs")
    meta = json.loads((other / "smol-rs" / "meta.json").read_text())
    meta.update(policy={"name": "smollm2", "hash": "0123abcd"}, policy_parameters=134515008)
    (other / "smol-rs" / "meta.json").write_text(json.dumps(meta))
    at = _page(_app(other, monkeypatch, ["smol-rs"]), "speed")
    assert not at.exception
    assert not any("plain_run" in frame.value.columns for frame in at.dataframe)
    assert "Speedup over plain decoding" not in str(_charts(at))
    assert "`smol-rs`: no speedup shown" in _texts(at.info) and "policy (smollm2 vs None)" in _texts(at.info)


def test_compare_page(root, monkeypatch):
    at = _page(_app(root, monkeypatch, ["plain", "rs-tv", "rs-ce"]), "compare")
    assert not at.exception and at.title[0].value == "Compare"
    summary = at.dataframe[0].value.set_index("run")
    assert summary.loc["rs-ce", "mtp_objective"] == "ce" and summary.loc["plain", "rollout"] == "none"
    assert float(summary.loc["rs-tv", "accept_length"]) > 1.0 and summary.loc["plain", "accept_length"] == "—"
    titles = [c["layout"]["title"]["text"] for c in _charts(at)]
    assert titles[0] == "Acceptance vs entropy" and titles[1] == "Pooled acceptance per draft position"
    assert titles[2].startswith("Eq. 16")
    assert len(at.get("download_button")) == 4
    assert any("Eq. 16" in s.value for s in at.subheader)


def test_a_column_mixing_numbers_and_text_is_shown_as_text(root, monkeypatch, tmp_path, caplog):
    """γ 3 beside γ "auto": Arrow cannot take the column as it is, and the terminal used to fill with tracebacks."""
    mixed = tmp_path / "runs"
    shutil.copytree(root / "rs-tv", mixed / "static")
    shutil.copytree(root / "rs-tv", mixed / "auto")
    meta = json.loads((mixed / "auto" / "meta.json").read_text())
    (mixed / "auto" / "meta.json").write_text(json.dumps({**meta, "gamma": "auto"}))
    at = _app(mixed, monkeypatch, None)
    assert not at.exception
    assert dict(at.dataframe[0].value.set_index("run")["gamma"]) == {"static": "3", "auto": "auto"}
    assert not [r for r in caplog.records if "Arrow" in r.getMessage()]


def test_compare_says_once_what_every_run_shares(root, monkeypatch):
    at = _page(_app(root, monkeypatch, ["plain", "rs-tv"]), "compare")
    summary = at.dataframe[0].value.set_index("run")
    assert "All these runs: task math" in _texts(at.caption) and "task" not in summary.columns
    assert "MTP loss" not in _texts(at.caption)  # e2e_tv for one, none for the plain run: a column, not a caption
    assert (summary.loc["rs-tv", "mtp_objective"], summary.loc["plain", "mtp_objective"]) == ("e2e_tv", "—")


def test_samples_page(root, monkeypatch):
    at = _page(_app(root, monkeypatch, ["rs-tv"]), "samples")
    assert not at.exception and at.title[0].value == "Samples"
    assert {m.label for m in at.metric} == {"reward", "accepted", "recovered", "bonus", "plain"}
    html = _texts(at.get("html"))
    assert "border-bottom:3px solid" in html and "nats" in html
    assert _charts(at)[0]["layout"]["title"]["text"].startswith("Entropy per generated token")
    assert len(at.get("download_button")) == 1
    at.select_slider(key="samples_step_rs-tv").set_value(3).run()
    assert not at.exception


@pytest.mark.parametrize("page", PAGES)
def test_pages_without_runs(tmp_path, monkeypatch, page):
    (tmp_path / "empty-root").mkdir()
    at = _app(tmp_path / "empty-root", monkeypatch, None)
    assert "No runs under" in _texts(at.info)
    at = _page(at, page)
    assert not at.exception and at.info and not at.get("plotly_chart")
    at = _app(tmp_path / "missing", monkeypatch, None)
    assert not at.exception and "does not exist" in _texts(at.info)


def test_dashboard_command_flags(tmp_path, monkeypatch):
    parser = argparse.ArgumentParser()
    dashboard.add_arguments(parser)
    args = parser.parse_args(["--runs", str(tmp_path), "--port", "8600"])
    cmd = dashboard.streamlit_command(args)
    assert cmd[1:4] == ["-m", "streamlit", "run"] and Path(cmd[4]) == dashboard.APP_SCRIPT and dashboard.APP_SCRIPT.exists()
    flags = dict(zip(cmd[5::2], cmd[6::2]))
    assert flags["--server.address"] == "127.0.0.1" and flags["--server.port"] == "8600"
    assert flags["--server.fileWatcherType"] == "none" and flags["--server.headless"] == "true"
    assert flags["--browser.gatherUsageStats"] == "false"
    monkeypatch.delenv("BEBOP_RUNS", raising=False)
    assert dashboard.runs_root(args) == tmp_path.resolve()
    with pytest.raises(ValueError, match="--port"):
        dashboard.streamlit_command(parser.parse_args(["--port", "70000"]))


def test_a_run_started_after_the_page_opened_joins_at_the_next_refresh(root, monkeypatch, tmp_path):
    """A job started after the dashboard opened is what its user came to watch: it joins the selection at the next
    script run, and when it finishes the sidebar's line of states says so."""
    live = tmp_path / "runs"
    shutil.copytree(root / "rs-tv", live / "rs-tv")
    at = _page(_app(live, monkeypatch, None), "live")
    assert at.sidebar.multiselect(key="runs_selected").value == ["rs-tv"]
    late = SyntheticRun(live / "late", SyntheticConfig(name="late", steps=5, drafts_per_step=8, samples_per_step=0))
    late.advance(2)
    at.run()  # what the sidebar's watcher triggers within one refresh when the runs under the root change
    assert not at.exception
    assert at.sidebar.multiselect(key="runs_selected").value == ["rs-tv", "late"]
    assert at.dataframe[0].value.set_index("run").loc["late", "state"] == "running"
    assert "[running] 1 (late)" in _texts(at.sidebar.caption)  # badges: ":green-badge[running]" on screen
    late.close()
    at.run()
    assert "[finished] 2" in _texts(at.sidebar.caption) and "running" not in _texts(at.sidebar.caption)
    assert at.dataframe[0].value.set_index("run").loc["late", "state"] == "finished"


def test_a_run_keeps_its_colour_whatever_joins_the_selection(root, monkeypatch):
    def colours(at) -> dict:
        law = [c for c in _charts(at) if c["layout"]["title"]["text"] == "Reward"][0]
        return {t["name"]: t["line"]["color"] for t in law["data"] if t.get("hoverinfo") != "skip"}

    at = _page(_app(root, monkeypatch, ["rs-tv"]), "live")
    first = colours(at)["rs-tv"]
    at.sidebar.multiselect(key="runs_selected").set_value(["plain", "rs-ce", "rs-tv"]).run()
    now = colours(at)
    assert now["rs-tv"] == first and len(set(now.values())) == 3  # kept, and the newcomers got colours of their own


def _refresh_script(root: str) -> None:
    from pathlib import Path

    import streamlit as st

    from bebop.app import state
    from bebop.runlog import list_runs

    infos = st.session_state.setdefault("infos", list_runs(root))  # what the page saw when it opened
    st.write(sorted(state.load_runs(infos, Path(root))))


def test_a_run_deleted_between_refreshes_is_a_warning(root, tmp_path):
    shutil.copytree(root / "rs-tv", tmp_path / "runs" / "a")
    shutil.copytree(root / "plain", tmp_path / "runs" / "b")
    at = AppTest.from_function(_refresh_script, args=(str(tmp_path / "runs"),), default_timeout=60).run()
    assert not at.warning
    shutil.rmtree(tmp_path / "runs" / "a")
    at.run()
    assert not at.exception
    assert "`a` was deleted or moved" in _texts(at.warning)


# ------------------------------------------------------------------------------ runs made by the real CLI
@pytest.fixture(scope="session")
def real_root() -> Path:
    from real_runs import real_runs_root

    return real_runs_root()


def test_real_runs_show_their_setup(real_root, monkeypatch):
    at = _app(real_root, monkeypatch, None)
    assert not at.exception
    table = at.dataframe[0].value.set_index("run")
    rs, plain = table.loc["rl-rs"], table.loc["rl-plain"]
    assert (rs["task"], rs["rollout"], rs["mtp_objective"], rs["mtp_strategy"], rs["gamma"], rs["mode"]) == \
        ("math", "rs", "e2e_tv", "frozen", "3", "async")  # a column with gaps is text on screen
    assert (plain["rollout"], plain["mode"]) == ("none", "async")
    assert plain["gamma"] == plain["mtp_objective"] == "—"  # no MTP: no γ, no loss, and a dash says so
    assert (table.loc["train-mtp", "task"], table.loc["train-mtp", "mtp_objective"]) == ("math", "e2e_tv")
    assert table.loc["eval-mtp", "task"] == "math" and table.loc["eval-mtp", "mtp_objective"] == "ce, e2e_tv"
    assert table.loc["eval-mtp", "rollout"] == "to, rs" and table.loc["eval-mtp", "gamma"] == "2"
    assert "rl-plain" in at.sidebar.multiselect(key="runs_selected").value
    assert "heartbeat_age_s" not in table.columns  # every run finished: no column of dashes


@pytest.mark.parametrize("page", (*PAGES, "mtp", "metrics"))
def test_every_page_renders_one_step_real_runs(real_root, monkeypatch, page):
    at = _page(_app(real_root, monkeypatch, ["rl-rs", "rl-plain", "train-mtp", "eval-mtp"]), page)
    assert not at.exception, at.exception
    # every page says what made its runs: the embedded default, by name, size, dtype and its weights' hash; the head
    made = _texts(at.caption)
    assert f"policy default ({load_default().model.num_parameters() / 1e6:.1f}M parameters, " in made
    assert f"weights {weights_hash(DEFAULT_DIR)[:8]}) · head e2e_tv (e2e_tv loss, trained depth " in made
    charts = _charts(at)
    if page in ("live", "speed", "metrics"):
        lines = [t for c in charts for t in c["data"]  # the drawn series, not their faint raw traces
                 if t.get("mode", "").startswith("lines") and t.get("x") not in (None, [None])
                 and t.get("hoverinfo") != "skip" and not t.get("name", "").endswith((" fit", " within"))]
        assert lines and all(t["mode"] == "lines+markers" for t in lines)  # a one-step series is a visible point
    if page == "live":
        headline = at.dataframe[0].value.set_index("run")
        assert float(headline.loc["rl-rs", "accept length (last 10)"]) > 1.0 and headline.loc["rl-rs", "step"] == "0"
        assert headline.loc["rl-plain", "accept length (last 10)"] == "—"
    if page == "compare":
        summary = at.dataframe[0].value
        assert summary.loc[summary["run"] == "rl-rs", "mtp_objective"].item() == "e2e_tv"
        assert "All these runs: policy default" in made and "policy" not in summary.columns  # said once, above
        assert {"eval-mtp · ce rs", "eval-mtp · e2e_tv to"} <= set(summary["series"].dropna())
    if page == "mtp":
        titles = {c["layout"]["title"]["text"] for c in charts}
        assert {"training loss (e2e_tv)", "held-out d_TV(p, q), mean over positions", "Acceptance vs entropy",
                "held-out d_TV(p, q) at draft position 1"} <= titles  # readable names; positions count from 1
        head = [c for c in charts if c["layout"]["title"]["text"] == "training loss (e2e_tv)"][0]
        assert head["layout"]["xaxis"]["title"]["text"] == "train-mtp step"
        assert head["data"][0]["name"] == "train-mtp · e2e_tv loss"  # the legend names the loss
        assert list(at.dataframe[0].value.columns[:1]) == ["head"]  # Table 2 from table2.csv
    if page == "metrics":
        titles = {c["layout"]["title"]["text"] for c in charts}
        assert {"actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "response_length/mean"} <= titles


def test_the_runs_table_names_each_runs_policy_and_head(real_root, monkeypatch):
    table = _app(real_root, monkeypatch, None).dataframe[0].value.set_index("run")
    assert set(table["policy"]) == {"default"}
    assert dict(table["head"]) == {"rl-rs": "e2e_tv", "rl-plain": "none", "train-mtp": "e2e_tv",
                                   "eval-mtp": "ce, e2e_tv"}  # train-mtp's head: no --out, named by its loss


SMOL = {"policy": {"name": "smollm2", "hash": "6b54f4a2" * 8, "dtype": "bfloat16", "parameters": 134515008},
        "head": {"name": "e2e_tv", "kind": "mtp", "objective": "e2e_tv", "depth": 5, "draft_vocab": 8192}}
SMOL_LINE = ("policy smollm2 (134.5M parameters, bfloat16, weights 6b54f4a2) · head e2e_tv (e2e_tv loss, trained "
             "depth 5, draft vocabulary 8,192)")


@pytest.fixture(scope="module")
def smol_root(real_root, root, tmp_path_factory) -> Path:
    """A SmolLM2 RL run and its head's train-mtp run (real runs whose meta.json says so), beside a run from before
    runs recorded what made them (synthetic: no `policy`, no `head`)."""
    runs = tmp_path_factory.mktemp("smol") / "runs"
    for name, real in (("smol-rs", "rl-rs"), ("smol-mtp", "train-mtp")):
        shutil.copytree(real_root / real, runs / name)
        meta = json.loads((runs / name / "meta.json").read_text())
        (runs / name / "meta.json").write_text(json.dumps({**meta, **SMOL}))
    shutil.copytree(root / "rs-tv", runs / "old-tiny")
    return runs


@pytest.mark.parametrize("page", ("runs", *PAGES, "mtp", "metrics"))
def test_every_page_names_the_policy_and_head_of_its_runs(smol_root, monkeypatch, page):
    """A SmolLM2 run never passes for a tiny-model one: each page names its runs' policy (size, dtype, weights) and
    head (loss, depth, draft vocabulary); a run that predates those keys reads as a dash, and nothing breaks."""
    at = _app(smol_root, monkeypatch, ["smol-rs", "smol-mtp", "old-tiny"])
    at = at if page == "runs" else _page(at, page)
    assert not at.exception, at.exception
    made = _texts(at.caption)
    assert f": {SMOL_LINE}" in made, made
    if page not in ("samples", "mtp"):  # pages of one run (the first with samples) or of MTP runs only
        assert "`old-tiny`: policy —" in made
    if page == "runs":
        table = at.dataframe[0].value.set_index("run")
        assert dict(table["policy"]) == {"smol-rs": "smollm2", "smol-mtp": "smollm2", "old-tiny": "—"}
        assert dict(table["head"]) == {"smol-rs": "e2e_tv", "smol-mtp": "e2e_tv", "old-tiny": "—"}
    if page == "compare":  # the runs' policies and heads differ: columns, not a line above the table
        summary = at.dataframe[0].value.set_index("run")
        assert tuple(summary.loc["smol-rs", ["policy", "head"]]) == ("smollm2", "e2e_tv")
        assert tuple(summary.loc["old-tiny", ["policy", "head"]]) == ("—", "—")


def test_a_runs_warnings_are_shown_on_the_runs_and_live_pages(root, monkeypatch, tmp_path):
    """An alert per run that raised warnings (the latest three, with their steps) on the Runs and Live pages, and
    their count in the Runs table; a run without warnings gets neither."""
    runs = tmp_path / "runs"
    shutil.copytree(root / "rs-tv", runs / "quiet")
    shutil.copytree(root / "rs-tv", runs / "stuck")
    writer = RunWriter(runs / "stuck", {}, kind="rl", resume=True)
    writer.warn("none of the run's first 16 prompt groups had completions that scored differently", source="no_signal",
                step=3)
    for step in (6, 9, 13):
        writer.warn(f"an alarm {step}: something went wrong", source="test", step=step)
    writer.close()
    at = _app(runs, monkeypatch, ["stuck", "quiet"])
    assert not at.exception
    alerts = [a.value for a in at.warning]
    assert len(alerts) == 1
    assert alerts[0].startswith("`stuck` raised 4 warnings (the latest 3; all in its warnings.jsonl):")
    assert "step 13: an alarm 13" in alerts[0] and "step 6: an alarm 6" in alerts[0]
    assert "prompt groups" not in alerts[0]  # the oldest is left to warnings.jsonl
    table = at.dataframe[0].value.set_index("run")
    assert (table.loc["stuck", "warnings"], table.loc["quiet", "warnings"]) == ("4", "—")
    live = _page(at, "live")
    assert not live.exception and [a.value for a in live.warning] == alerts


def test_speed_prediction_comes_from_the_logged_step_costs(real_root, monkeypatch):
    at = _page(_app(real_root, monkeypatch, ["rl-rs", "rl-plain"]), "speed")
    assert not at.exception
    row = _speedups(at).set_index("run").loc["rl-rs"]
    assert row["plain_run"] == "rl-plain"
    plain, spec = _records(real_root / "rl-plain")[0], _records(real_root / "rl-rs")[0]  # their one step each
    plain_step = (plain["engine/verify_s"] + plain["engine/advance_s"]) / plain["engine/num_steps"]
    spec_step = (spec["engine/draft_s"] + spec["engine/verify_s"] + spec["engine/advance_s"]) / spec["engine/num_steps"]
    tokens = 1 + spec["spec/num_accepted_tokens"] / spec["engine/num_row_steps"]
    assert row["step_cost"] == pytest.approx(spec_step / plain_step)
    assert row["predicted"] == pytest.approx(tokens / (spec_step / plain_step))
    assert row["measured_rollout"] == pytest.approx(plain["timing_s/gen"] / spec["timing_s/gen"])


def _printed_speedups(out: str) -> dict[str, tuple[str, str, str]]:
    """The demo's speed table: {rows per step: (predicted, rollout, end to end)} as printed ("1.32x")."""
    rows = {}
    for line in out[out.index("rows per step"):].splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0].isdigit():
            rows[cells[0]] = (cells[3], cells[4].rstrip(" *"), cells[5].rstrip(" †"))
    return rows


def test_speed_page_pairs_the_demo_runs_and_prints_its_ratios(monkeypatch):
    """Over `bebop demo`'s four runs the page divides rows32 by rows32 and rows4 by rows4, with the demo's numbers."""
    from real_runs import demo_runs

    folder, out = demo_runs()
    printed = _printed_speedups(out)
    assert set(printed) == {"32", "4"}
    names = [f"{folder.name}/{run}" for run in ("rows32-no-mtp", "rows32-mtp-rs-e2e_tv", "rows4-no-mtp",
                                                 "rows4-mtp-rs-e2e_tv")]
    at = _page(_app(folder.parent, monkeypatch, names), "speed")
    assert not at.exception
    table = _speedups(at).set_index("run")
    # rows32 over rows32, rows4 over rows4; the runs' folder named once above the table, which then fits the page
    assert dict(table["plain_run"]) == {"rows32-mtp-rs-e2e_tv": "rows32-no-mtp", "rows4-mtp-rs-e2e_tv": "rows4-no-mtp"}
    assert f"Runs in `{folder.name}/`" in _texts(at.caption)
    made = _texts(at.caption)  # what made them, by the names the table gives them
    assert "`rows32-mtp-rs-e2e_tv`, `rows4-mtp-rs-e2e_tv`: policy default (" in made
    assert f"`{folder.name}/rows" not in made
    for rows, run in (("32", "rows32-mtp-rs-e2e_tv"), ("4", "rows4-mtp-rs-e2e_tv")):
        shown = tuple(f"{float(table.loc[run, c]):.2f}x" for c in ("predicted", "measured_rollout",
                                                                      "measured_end_to_end"))
        assert shown == printed[rows], (rows, shown, printed[rows])


# ------------------------------------------------------------------------------ partial runs, roots, selection
def test_a_partial_run_from_another_loop_renders_and_names_the_missing_field(tmp_path, monkeypatch):
    with RunWriter(tmp_path / "theirs", {"task": "math"}, kind="rl") as w:
        for step in range(3):
            w.log("train", {"step": step, "actor/entropy": 0.3 + 0.1 * step, "critic/score/mean": 0.5,
                            "spec/num_drafts": 10, "spec/num_draft_tokens": 30, "spec/num_accepted_tokens": 20})
    at = _app(tmp_path, monkeypatch, ["theirs"])
    for page in (*PAGES, "metrics"):
        at = _page(at, page)
        assert not at.exception, (page, at.exception)
    at = _page(at, "live")
    assert "lack `spec/gamma`" in _texts(at.caption)
    assert {"Policy entropy", "Reward"} <= {c["layout"]["title"]["text"] for c in _charts(at)}


def test_changing_the_root_is_not_a_run_going_missing(root, real_root, monkeypatch):
    at = _app(root, monkeypatch, ["rs-tv", "plain"])
    at.sidebar.text_input(key="runs_root").set_value(str(real_root)).run()
    assert not at.exception and not at.sidebar.warning
    assert "rl-plain" in at.sidebar.multiselect(key="runs_selected").value  # the new root's default selection
    at.sidebar.text_input(key="runs_root").set_value(str(root)).run()
    assert not at.sidebar.warning and at.sidebar.multiselect(key="runs_selected").value


def test_default_selection_keeps_a_plain_baseline(tmp_path, monkeypatch):
    small = {"steps": 2, "drafts_per_step": 8, "samples_per_step": 0}
    write_synthetic_run(tmp_path / "plain", SyntheticConfig(name="plain", rollout="none", mtp_objective=None,
                                                            mtp_strategy=None, **small))
    for i in range(6):  # newer than the plain run: a newest-first default would leave it out
        write_synthetic_run(tmp_path / f"rs-{i}", SyntheticConfig(name=f"rs-{i}", seed=i, **small))
    at = _app(tmp_path, monkeypatch, None)
    chosen = at.sidebar.multiselect(key="runs_selected").value
    assert len(chosen) == 5 and "plain" in chosen


# ------------------------------------------------------------------------------------------------ reference runs
@pytest.mark.parametrize("page", ("runs", *PAGES, "metrics"))
def test_a_reference_run_opens_beside_the_preview_like_any_run(tmp_path, monkeypatch, page):
    """What `bebop preview` copies of a shipped reference run (a `bebop rl` run packed without its checkpoint:
    tests/reference_run.py) opens on every page beside the synthetic runs; the app writes nothing into it."""
    from reference_run import NAME, packed_root

    from bebop.cli import main

    monkeypatch.setenv("BEBOP_REFERENCE_RUNS", str(packed_root()))
    root = tmp_path / "preview"
    assert main(["preview", str(root), "--steps", "3"]) == 0
    run = f"reference/{NAME}"
    before = _snapshot(root / "reference")
    at = _app(root, monkeypatch, [run, "no-mtp (synthetic)"])  # the preview's runs are marked as simulated
    at = at if page == "runs" else _page(at, page)
    assert not at.exception, at.exception
    if page == "runs":
        table = at.dataframe[0].value.set_index("run")
        assert (table.loc[run, "state"], table.loc[run, "policy"], table.loc[run, "head"]) == ("finished", "default",
                                                                                               "e2e_tv")
    elif page == "samples":  # the reference run's own rollouts, step by step
        assert at.selectbox(key="samples_run").value == run and at.get("html") and _charts(at)
        assert at.select_slider(key=f"samples_step_{run}").value == 3  # its last step
    else:
        assert any(t.get("legendgroup") == run or t.get("name") == run for c in _charts(at) for t in c["data"])
    assert _snapshot(root / "reference") == before


def test_dashboard_reference_opens_the_packed_runs_where_they_lie(monkeypatch):
    from reference_run import NAME, packed_root

    before = _snapshot(packed_root())
    at = _page(_app(packed_root(), monkeypatch, [NAME]), "live")
    assert not at.exception and _charts(at)
    assert _snapshot(packed_root()) == before  # the package's folder is only read


@pytest.mark.parametrize("page", ["live", "speed"])
def test_a_per_row_run_shows_each_rows_depth_and_the_budget(tmp_path, monkeypatch, page):
    """A run whose engine gave each row its own depth (gamma="rows") gets the depth distribution per RL step and the
    verify-token budget on the Live and Speed pages (bebop.plots.row_depths); a run without them, neither."""
    run = write_synthetic_run(tmp_path / "rows", SyntheticConfig(name="rows", seed=5, steps=6, drafts_per_step=24,
                                                                samples_per_step=1, sample_tokens=16))
    records = _records(run)
    for i, record in enumerate(records):
        record.update({"spec/num_row_depth/0": 10 + i, "spec/num_row_depth/1": 6, "spec/num_row_depth/3": 16 - i,
                       "spec/num_budget_tokens": 90, "engine/num_row_steps": 32, "spec/num_lookup_row_steps": 2})
    (run / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_synthetic_run(tmp_path / "plain", SyntheticConfig(name="plain", rollout="none", mtp_objective=None,
                                                            mtp_strategy=None, seed=1, steps=6))
    at = _page(_app(tmp_path, monkeypatch, ["rows", "plain"]), page)
    assert not at.exception
    titles = [c["layout"]["title"]["text"] for c in _charts(at)]
    assert "Each row's draft depth (share of row-steps per depth)" in titles
    assert "Verify-token budget per row (1 = plain decoding)" in titles
    at = _page(_app(tmp_path, monkeypatch, ["plain"]), page)
    assert not any("Each row's draft depth" in c["layout"]["title"]["text"] for c in _charts(at))
