"""All metrics: any series any selected run logged, in any of its streams, one chart each (as W&B shows them)."""

import streamlit as st

from bebop import plots
from bebop.app import state

# Shown first when present: what the other pages do not draw (RL losses and norms, MTP losses and evaluations).
FIRST = ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "response_length/mean")

root, infos, chosen, message = state.selected()
state.title("All metrics", chosen)
if not chosen:
    st.info(message or "Pick one or more runs in the sidebar.", icon=":material/info:")
    st.stop()
state.note_made_by({state.label(info, root): info.meta for info in chosen})
colors = state.run_colors(state.label(info, root) for info in chosen)
runs = state.load_runs(chosen, root)
streams = sorted({name for run in runs.values() for name, frame in run.streams.items()
                  if "step" in frame.columns and len(frame)})
if not streams:
    st.info("None of the selected runs has logged a stream with steps yet.", icon=":material/hourglass_empty:")
    st.stop()

c1, c2, c3 = st.columns([1, 4, 1.5])
stream = c1.selectbox("Stream", streams, index=streams.index("train") if "train" in streams else 0, key="metrics_stream")
frames = plots.by_series({name: run.streams[stream] for name, run in runs.items()
                          if stream in run.streams and "step" in run.streams[stream].columns})
series = plots.numeric_series(frames)
first = [s for s in series if s in FIRST or s.startswith(("mtp/loss/", "mtp/eval/"))]
chosen_series = c2.multiselect("Series", series, default=(first or series)[:6], key=f"metrics_series_{stream}",
                               placeholder="Pick any logged series")
smoothing = c3.slider("Smoothing", 0.0, 0.95, 0.0, 0.05, key="metrics_smoothing")
if not chosen_series:
    st.info(f"{len(series)} series logged in `{stream}`: pick some above.")
    st.stop()
kinds = {run.meta.get("kind") for name, run in runs.items() if stream in run.streams}
x_title = {frozenset({"rl"}): "RL step", frozenset({"train-mtp"}): "train-mtp step"}.get(frozenset(kinds), "step")
columns = st.columns(2)
for i, column in enumerate(chosen_series):
    data = plots.over_time(frames, [column])
    with columns[i % 2]:
        if data.empty:
            st.info(f"No selected run logs `{column}` in `{stream}`.")
            continue
        st.plotly_chart(plots.lines(data, [column], title=column, y_title=column, smoothing=smoothing, colors=colors,
                                    x_title=x_title), key=f"metrics_{stream}_{column}")
        state.download(data, f"{stream}_{column.replace('/', '_')}.csv", key=f"dl_metrics_{stream}_{column}")
