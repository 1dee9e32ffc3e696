"""Speed: tokens/s, where a step's time goes, the measured speedup over a no-MTP run, and apart from it the bound
that theory gives from the runs' own acceptance and step costs."""

import streamlit as st

from bebop import plots
from bebop.app import state
from bebop.plots import speed as speed_plots

root, infos, chosen, message = state.selected()
st.title("Speed")
if not chosen:
    st.info(message or "Pick one or more runs in the sidebar.", icon=":material/info:")
    st.stop()
# The baseline must decode without MTP whenever the root has such a run, selected or not.
extra = [] if any(state.is_plain(info) for info in chosen) else [info for info in infos if state.is_plain(info)][:1]
names = [state.label(info, root) for info in chosen + extra]
colors = plots.run_colors(names)
trains = state.trains(state.load_runs(chosen + extra, root))
if not trains:
    st.stop()
if extra:
    st.caption(f"Baseline `{state.label(extra[0], root)}` (no MTP) added: none of the selected runs decodes without MTP.")

timed = list(plots.step_times(trains)["run"])
plain = [name for name in timed if not plots.has_spec(trains[name])]
c1, c2, c3 = st.columns([2, 1.4, 1.5])
baseline = c1.selectbox("Baseline run", timed, index=timed.index(plain[0]) if plain else 0, key="speed_baseline",
                        help="speedups are this run's time divided by each run's time") if timed else None
assume = c2.toggle("Assume step costs", key="speed_assume",
                   help="replace the step costs the engine measured with your own (an assumption)")
x = c3.segmented_control("x-axis", list(plots.X_AXES), default="step", key="speed_x",
                         format_func=str.capitalize) or "step"
draft_cost = verify_cost = None
if assume:
    a1, a2 = st.columns(2)
    draft_cost = a1.number_input("Assumed draft step cost", 0.0, 2.0, 0.05, 0.01, key="speed_draft_cost",
                                 help="one MTP draft step, in units of a plain 1-token decode step")
    verify_cost = a2.number_input("Assumed verify step cost", 0.1, 5.0, 1.1, 0.05, key="speed_verify_cost",
                                  help="one (γ+1)-token target forward, in units of a plain decode step")

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

# gamma="auto": the depth the engine chose per RL step and the step costs it chose from (bebop.engine.depth).
depths = speed_plots.chosen_depths(trains)
if not depths.empty:
    st.subheader("Draft depth chosen by the engine")
    d1, d2 = st.columns(2)
    d1.plotly_chart(speed_plots.chosen_depth_figure(depths, colors=colors), key="speed_depths")
    state.download(depths, "chosen_depths.csv", key="dl_speed_depths")
    costs = speed_plots.measured_costs(trains)
    if not costs.empty:
        d2.plotly_chart(speed_plots.measured_cost_figure(costs), key="speed_costs")
        state.download(costs, "step_costs.csv", key="dl_speed_costs")
    st.caption("Before each engine step the engine picks γ in 0..max_gamma maximising (1 + E[accepted | γ]) / "
               "cost(rows, γ), both measured as it runs: E[accepted] from its per-position acceptance, the cost from "
               "its own step timings per rows bucket (`engine/cost/{rows}/{γ}`). γ = 0 is plain decoding.")

# Draft health (bebop.rl.draft_health): the entropy law's residual; an alarm means the draft parted from the policy.
health = speed_plots.draft_health(trains)
if not health.empty:
    st.subheader("Draft health")
    alarms = health[health["alarm"] > 0]
    for run, part in alarms.groupby("run"):
        st.warning(f"`{run}`, step {int(part['step'].iloc[0])} (and {len(part) - 1} later): "
                   f"{part['warning'].iloc[0]}", icon=":material/warning:")
    st.plotly_chart(speed_plots.draft_health_figure(health, colors=colors), key="speed_health")
    state.download(health, "draft_health.csv", key="dl_speed_health")

if baseline is None:
    st.stop()
if baseline not in plain:
    st.warning(f"`{baseline}` decodes with MTP: speedups against it are not speedups over plain decoding.",
               icon=":material/warning:")
table = plots.speedup_table(trains, baseline, draft_cost=draft_cost, verify_cost=verify_cost)
measured, bound = st.columns(2)
measured.plotly_chart(plots.speedup_figure(table, baseline), key="speed_speedup")
bound.plotly_chart(plots.bound_figure(table), key="speed_bound")
st.dataframe(table, hide_index=True, width="stretch",
             column_config=state.column_titles(table, {c: "%.2f" for c in table.columns if c not in ("run", "costs")}))
state.download(table, "speedup.csv", key="dl_speed_speedup")
st.caption("Measured: the baseline's mean seconds per step divided by the run's (whole step, and generation only). "
           "Theoretical: (1 + Σ_j Π_{i≤j} α_i) / (verify cost + γ · draft cost) from the run's pooled α_i, with the "
           "costs in units of the baseline's plain decode step: measured by the engine (its `engine/*` counters) "
           "unless you assume them above. It bounds the decode loop, so compare it with the generation bar.")
