"""Compare: the paper's comparisons side by side for the selected runs (TO vs RS, CE vs e2e TV, frozen vs online)."""

import pandas as pd
import streamlit as st

from bebop import metrics, plots, speedup
from bebop.app import state
from bebop.runlog.setup import head_of, policy_of

root, infos, chosen, message = state.selected()
state.title("Compare", chosen)
if len(chosen) < 1:
    st.info(message or "Pick the runs to compare in the sidebar (e.g. an e2e TV head vs a CE head).", icon=":material/info:")
    st.stop()
state.note_made_by({state.label(info, root): info.meta for info in chosen})
names = [state.label(info, root) for info in chosen]
colors = state.run_colors(names)
runs = state.load_runs(chosen, root)
trains = state.trains(runs)
if not runs:
    st.stop()

rows = []
for info in chosen:
    name = state.label(info, root)
    train = trains.get(name)
    # The head by name: two heads of one loss (a shipped one, one over a draft vocabulary) are told apart.
    row = {"run": name, "policy": policy_of(info.meta), "head": head_of(info.meta),
           **{key: state.shown(info.setup.get(key)) for key in state.CONFIG_KEYS}}
    if train is not None:
        tail = train.tail(max(1, len(train) // 10))  # the last tenth: where the run ended up
        row["steps"] = len(train)
        if plots.has_spec(train):
            row["accept_length"] = metrics.derive(plots.pooled(train))[plots.ACCEPT_LENGTH]
        for column, short in (("critic/score/mean", "final_reward"), ("actor/entropy", "final_entropy")):
            if column in tail.columns:
                row[short] = float(tail[column].mean())
        timing = speedup.step_stats(train.to_dict("records"))  # the one step-time statistic of every page
        row["step_s"], row["tokens_per_s"] = timing["step_s"], timing["tokens_per_s"]
    rows.append(row)
view = state.better_law_view(runs)  # the entropy law in the view its fits support better, as on the Live page
points, y_title = state.entropy_points(runs, by=view)
# An evaluation run's law comes per (head, method) series, labelled "run · head method": one row per series,
# whether or not its points share the chart (per step, the chart's y is the RL runs' accept length).
evals = state.eval_points({name: run for name, run in runs.items() if name not in set(points["run"])})
law = pd.concat([p for p in (points, evals) if not p.empty] or [points], ignore_index=True)
fits = plots.entropy_fits(law)[["run", "slope", "r2"]].rename(columns={"run": "series"})
fits["run"] = fits["series"].str.split(" · ").str[0]
summary = pd.DataFrame(rows).merge(fits, on="run", how="left")
summary["series"] = summary["series"].where(summary["series"] != summary["run"])
summary = summary.dropna(axis="columns", how="all")
# What the page compares first (the law and the acceptance), then what the runs are: the table scrolls, the left stays.
first = [c for c in ("run", "series", "slope", "r2", "accept_length") if c in summary.columns]
summary = summary[first + [c for c in summary.columns if c not in first]]
st.subheader("Summary")
# What every run shares is said once, above the table, so the columns left are the ones that tell runs apart.
same = {c: summary[c].iloc[0] for c in summary.columns if c in ("policy", "head", *state.CONFIG_KEYS)
        and len(summary) > 1 and len({str(v) for v in summary[c]}) == 1}
said = {c: v for c, v in same.items() if v != state.MISSING}  # runs that all do not say: nothing to say
if said:
    st.caption("All these runs: " + ", ".join(f"{state.TITLES.get(c, c)} {v}" for c, v in said.items()))
formats = {"slope": "%+.3f", "r2": "%.3f", "accept_length": "%.3f", "final_reward": "%.3f", "final_entropy": "%.3f",
           "step_s": "%.2f", "tokens_per_s": "%.0f", "steps": "%d"}
state.show_table(summary.drop(columns=list(same)), formats)
state.download(summary, "compare_summary.csv", key="dl_compare_summary")

left, right = st.columns(2)
with left:
    if points.empty:
        st.info("None of these runs used MTP rollouts, so there is no acceptance to compare.")
    else:
        st.caption(state.law_views_caption(runs, view))
        st.plotly_chart(plots.acceptance_vs_entropy(points, colors=colors, y_title=y_title), key="compare_entropy_law")
        state.download(points, "compare_acceptance_vs_entropy.csv", key="dl_compare_entropy_law")
with right:
    table = plots.positions(trains)
    if not table.empty:
        st.plotly_chart(plots.positions_figure(table, colors=colors), key="compare_positions")
        state.download(table, "compare_positions.csv", key="dl_compare_positions")

st.subheader("Where the change in acceptance comes from (Eq. 16)")
fit_fraction = st.slider("Early phase used to fit the entropy slope b", 0.1, 0.5, 0.2, 0.05, key="compare_fit",
                         format="%.2f", help="fraction of the run's steps")
decomposition = plots.decomposition_data(trains, fit_fraction=fit_fraction)
if decomposition.empty:
    st.info("The decomposition needs MTP runs with enough steps (at least 3 in the fitting window).")
else:
    st.plotly_chart(plots.decomposition_figure(decomposition), key="compare_decomposition")
    state.download(decomposition, "compare_decomposition.csv", key="dl_compare_decomposition")
    st.caption("Δ accept length since the first steps = b·(H_t − H_0) (entropy part) + the rest (mismatch part), "
               "with b fitted on the early phase. A flat TV head shows little of either; an online CE update "
               "shows up as mismatch.")
