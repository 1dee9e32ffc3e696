"""Shadow heads: every head a run scored on its own rollouts (`bebop rl --shadow-heads`), head x rule along the run,
the entropy law of each with its fit, and frozen beside online (`bebop.rl.shadow_summary`, `bebop.plots.shadow`)."""

import streamlit as st

from bebop import plots
from bebop.app import state
from bebop.plots import shadow as shadow_plots
from bebop.rl.shadow_report import shadow_points, shadow_summary
from bebop.runlog.setup import head_of

runs = state.open_page("Shadow heads", "Pick one or more runs in the sidebar.")
scored = {name: run for name, run in runs.items() if len(run.streams.get("shadow", ()))}
if not scored:
    st.info("None of the selected runs scored shadow heads. `bebop rl --shadow-heads ce online-tv:e2e_tv ...` scores "
            "other heads on every step's rollouts; `bebop dashboard --reference` opens the shipped SmolLM2 runs, which "
            "did.", icon=":material/info:")
    st.stop()
name = st.selectbox("Run", list(scored), key="shadow_run") if len(scored) > 1 else next(iter(scored))
run = scored[name]
state.note_made_by({name: run.meta})
train = run.streams.get("train")
depth = shadow_plots.scored_depth(run.streams["shadow"])
drafted = shadow_plots.mean_depth(train) if train is not None else float("nan")
st.caption(
    f"Each RL step scored every head below on that step's rollouts, under TO and under RS, at γ = {depth or '?'}: the "
    f"heads compare on the same tokens. `rollout` is the head the run drafted with ({head_of(run.meta)}). What the "
    "rollout itself accepted (the Live page's accept length) is at the depth the engine chose each step"
    + (f" (mean γ {drafted:.1f})" if drafted == drafted else "") + ", drawn grey below as "
    f"“{shadow_plots.AS_DRAFTED}”: it is not one of the scored series.")


@st.cache_data(max_entries=16, show_spinner="Fitting every head's law, with bootstrap intervals…")
def summary(path: str, rows: int, by: str):
    """`shadow_summary` once per run, view and stream length (a live run refits when it grows)."""
    return shadow_summary(path, by=by)


by = st.segmented_control("Entropy-law points", ("step", "bin"), default="step", key="shadow_by",
                          format_func={"step": "per RL step", "bin": "per entropy bin (pooled over the run)"}.get) \
    or "step"
points = shadow_points(run, by=by)
table = summary(str(run.path), len(run.streams["shadow"]), by)
colors = plots.series_colors(shadow_plots.series_order(points))
y_title = "accept length (tokens / verify step)" if by == "step" else "acceptance rate (accepted / reached drafts)"

st.subheader("The entropy law, head by head")
st.plotly_chart(plots.acceptance_vs_entropy(points, colors=colors, y_title=y_title), key="shadow_law")
state.download(points, "shadow_law_points.csv", key="dl_shadow_law")
rows = shadow_plots.law_rows(table)
st.caption("Slopes per nat of the policy's mean entropy at the drafted positions, with 95% bootstrap intervals. A "
           "flagged fit rests on the layout of its points (separated clusters, one point that sets the line, nearly "
           "empty bins): its within slope, inside the main cluster or without that point, is the one to quote "
           "beside it (`bebop.entropy_law`).")
# Written out, not a grid: a flag is a sentence with its numbers, which a table cell would cut.
st.markdown("\n".join(f"- {line}" for line in shadow_plots.law_lines(rows)))
state.download(table, "shadow_summary.csv", key="dl_shadow_summary")

st.subheader("Along the run")
steps = shadow_points(run, by="step")
data = shadow_plots.over_steps(steps, train)
st.plotly_chart(plots.lines(data, ["acceptance"], title="Accept length per RL step", x_title="RL step",
                            y_title="tokens / verify step", colors={**colors, shadow_plots.AS_DRAFTED: "#9AA0A6"},
                            from_zero=True), key="shadow_steps")
state.download(data, "shadow_over_steps.csv", key="dl_shadow_steps")

st.subheader("Frozen beside online")
st.plotly_chart(shadow_plots.drift_figure(table, colors=colors), key="shadow_drift")
st.table(rows[["head", "rule", "strategy", "start", "end", "relative_change"]].rename(
    columns={"relative_change": "relative change [95%]", "start": "start [95%]", "end": "end [95%]"}))
