"""Speed: tokens/s, where a step's time goes, and the measured speedup next to the theoretical one."""

import streamlit as st

from bebop import plots
from bebop.app import state

root, infos, chosen, message = state.selected()
st.title("Speed")
if not chosen:
    st.info(message or "Pick one or more runs in the sidebar.", icon=":material/info:")
    st.stop()
names = [state.label(info, root) for info in chosen]
colors = plots.run_colors(names)
trains = state.trains(state.load_runs(chosen, root))
if not trains:
    st.stop()

timed = list(plots.step_times(trains)["run"])
plain = [name for name in timed if "spec/num_drafts" not in trains[name].columns]
c1, c2, c3, c4 = st.columns([2, 1, 1, 1.5])
baseline = c1.selectbox("Baseline run", timed, index=timed.index(plain[0]) if plain else 0, key="speed_baseline",
                        help="speedups are this run's time divided by each run's time") if timed else None
draft_cost = c2.number_input("Draft step cost", 0.0, 2.0, 0.05, 0.01, key="speed_draft_cost",
                             help="one MTP draft step, in units of a plain 1-token decode step")
verify_cost = c3.number_input("Verify step cost", 0.1, 5.0, 1.1, 0.05, key="speed_verify_cost",
                              help="one (γ+1)-token target forward, in units of a plain decode step")
x = c4.segmented_control("x-axis", list(plots.X_AXES), default="step", key="speed_x",
                         format_func=str.capitalize) or "step"

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

if baseline is None:
    st.stop()
table = plots.speedup_table(trains, baseline, draft_cost=draft_cost, verify_cost=verify_cost)
st.plotly_chart(plots.speedup_figure(table, baseline), key="speed_speedup")
st.dataframe(table, hide_index=True, width="stretch",
             column_config={c: st.column_config.NumberColumn(format="%.2f") for c in table.columns if c != "run"})
state.download(table, "speedup.csv", key="dl_speed_speedup")
st.caption("Measured: baseline mean seconds per step divided by the run's (whole step, and generation only). "
           "Theoretical: (1 + Σ_j Π_{i≤j} α_i) / (verify cost + γ · draft cost) from the run's pooled α_i; it bounds "
           "the generation phase, so compare it with the generation bar. Async steps overlap generation and update.")
