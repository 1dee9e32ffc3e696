"""Speed: tokens/s, where a step's time goes, and each MTP run's speedup over the plain-decoding run that did the same
work (`bebop.speedup`: the pairing, the statistic and the prediction `bebop demo` prints too)."""

import streamlit as st

from bebop import plots, speedup
from bebop.app import alerts, state
from bebop.plots import speed as speed_plots

root, infos, chosen, message = state.selected()
state.title("Speed", chosen)
if not chosen:
    st.info(message or "Pick one or more runs in the sidebar.", icon=":material/info:")
    st.stop()
# A speedup divides by the plain run of the same workload, selected or not: found under the whole root.
pairs, unpaired = state.speed_pairs(chosen, infos, root)
picked = {info.path for info in chosen}
added = list({info.path: info for info in pairs.values() if info.path not in picked}.values())
colors = state.run_colors(state.label(info, root) for info in chosen + added)
state.note_made_by({state.label(info, root): info.meta for info in chosen + added})  # a partner ran the same policy
trains = state.trains(state.load_runs(chosen + added, root))
if not trains:
    st.stop()
x = st.segmented_control("x-axis", list(plots.X_AXES), default="step", key="speed_x", format_func=str.capitalize) \
    or "step"
st.caption(f"Every time per step and every tokens / s on these pages is the {speedup.STATISTIC}.")

left, right = st.columns(2)
with left:
    data = plots.over_time(trains, ["perf/throughput"], x=x)
    if data.empty:
        st.info("No `perf/throughput` logged yet.")
    else:
        st.plotly_chart(plots.lines(data, ["perf/throughput"], title="Throughput", x=x, smoothing=0.6,
                                    y_title="generated tokens / s", colors=colors), key="speed_throughput")
        state.download(data, "throughput.csv", key="dl_speed_throughput")
with right:
    times = plots.step_times(trains)
    if times.empty:
        st.info("No `timing_s/*` logged yet.")
    else:
        st.plotly_chart(plots.step_time_figure(times), key="speed_step_time")
        state.download(times, "step_times.csv", key="dl_speed_step_time")
if not times.empty:  # seconds per step beside tokens per second: a shorter step may only have written less
    state.show_table(times.rename(columns={"gen": "generation", "update": "update", "step": "whole step"}),
                     {c: "%.2f" for c in ("generation", "update", "whole step")} | {"tokens_per_s": "%.0f"},
                     helps={"tokens_per_s": "generated tokens per second of generation",
                            "generation": speedup.STEP_TIME, "whole step": speedup.STEP_TIME})

st.subheader("Speedup over plain decoding")
st.caption("A speedup divides a plain-decoding run's time by an MTP run's only where the two did the same work: the "
           "same " + ", ".join(speedup.WORKLOAD.values()) + ". Predicted: "
           "from measured costs, the tokens each row gains per engine step over what an MTP engine step costs in the "
           "plain run's engine steps; it covers the decode loop only, so compare it with the generation bar.")
for name, why in unpaired.items():
    st.info(f"`{name}`: no speedup shown: {why}.", icon=":material/block:")
for info in added:
    st.caption(f":material/link: `{state.label(info, root)}` (not selected) is the plain partner of "
               + ", ".join(f"`{run}`" for run, partner in pairs.items() if partner.path == info.path) + ".")
table = plots.speedup_table(trains, {run: state.label(partner, root) for run, partner in pairs.items()
                                     if run in trains and state.label(partner, root) in trains})
if table.empty:
    if not unpaired:
        st.info("None of the selected runs decodes with MTP: there is no speedup to show.", icon=":material/info:")
else:
    for row in table[table["note"] != ""].itertuples():
        st.warning(f"`{row.run}`: {row.note}.", icon=":material/warning:")
    for row in table[table["credit"] != ""].itertuples():  # what the speedups owe to something other than drafting
        st.warning(f"`{row.run}`: {row.credit}.", icon=":material/balance:")
    st.plotly_chart(plots.speedup_figure(table), key="speed_speedup")
    # The notes stand above the chart; the table keeps to numbers, ratios first, and names a partner in the run's own
    # folder by its name there (the demo's pairs), so the table fits the page.
    shown = table[["run", "plain_run", "measured_rollout", "predicted", "measured_end_to_end", "measured_update",
                   "response_ratio", "tokens_per_row_step", "step_cost"]].copy()
    shown["plain_run"] = [plain.rsplit("/", 1)[-1] if plain.rsplit("/", 1)[0] == run.rsplit("/", 1)[0] else plain
                          for run, plain in zip(shown["run"], shown["plain_run"])]
    state.show_table(shown, {c: "%.2f" for c in shown.columns if c not in ("run", "plain_run")})
    state.download(table, "speedup.csv", key="dl_speed_speedup")

# gamma="auto": the depth the engine chose per RL step and the step costs it chose from (bebop.engine.depth).
depths = speed_plots.chosen_depths(trains)
if not depths.empty:
    st.subheader("Draft depth chosen by the engine")
    d1, d2 = st.columns(2)
    with d1:
        st.plotly_chart(speed_plots.chosen_depth_figure(depths, colors=colors), key="speed_depths")
        state.download(depths, "chosen_depths.csv", key="dl_speed_depths")
    costs = speed_plots.measured_costs(trains)
    with d2:
        if not costs.empty:
            st.plotly_chart(speed_plots.measured_cost_figure(costs, colors=colors), key="speed_costs")
            state.download(costs, "step_costs.csv", key="dl_speed_costs")
    st.caption("Before each engine step the engine picks γ in 0..max_gamma maximising (1 + E[accepted | γ]) / "
               "cost(rows, γ), both measured as it runs: E[accepted] from its per-position acceptance, the cost from "
               "its own step timings per rows bucket (`engine/cost/{rows}/{γ}`). γ = 0 is plain decoding.")

# gamma="rows": each row's depth per RL step and the verify-token budget (bebop.engine.depth.rows).
state.show_row_depths(trains, colors, "speed", "Each row's draft depth and the verify-token budget")

# Draft health (bebop.rl.draft_health, replayed with this code): the entropy law's residual; an alarm reads its sign.
health = speed_plots.draft_health({name: alerts.health(name, train) for name, train in trains.items()})
if not health.empty:
    st.subheader("Draft health")
    alarms = health[health["alarm"] > 0]
    for run, part in alarms.groupby("run"):
        st.warning(f"`{run}`, step {int(part['step'].iloc[0])} (and {len(part) - 1} later): "
                   f"{part['warning'].iloc[0]}", icon=":material/warning:")
    st.plotly_chart(speed_plots.draft_health_figure(health, colors=colors), key="speed_health")
    state.download(health, "draft_health.csv", key="dl_speed_health")
