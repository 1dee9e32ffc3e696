"""MTP heads: the runs that train heads (`bebop train-mtp`) and that evaluate them (`bebop eval-mtp`, PAPER Table 2)."""

import pandas as pd
import streamlit as st

from bebop import plots
from bebop.app import state

root, infos, chosen, message = state.selected()
st.title("MTP heads")
kinds = ("train-mtp", "eval-mtp")
picked = [info for info in chosen if info.kind in kinds]
if not picked:
    others = [state.label(info, root) for info in infos if info.kind in kinds]
    hint = f" Under this root: {', '.join(f'`{n}`' for n in others)}." if others else ""
    st.info(message or f"Pick a `bebop train-mtp` or `bebop eval-mtp` run in the sidebar.{hint}", icon=":material/info:")
    st.stop()
colors = plots.run_colors(state.label(info, root) for info in picked)
runs = state.load_runs(picked, root)
training = {name: run for name, run in runs.items() if run.meta.get("kind") == "train-mtp"}
evaluating = {name: run for name, run in runs.items() if run.meta.get("kind") == "eval-mtp"}


def stream_lines(stream: str, prefix: str, title: str) -> None:
    """Every `prefix*` series of `stream` in the training runs, one chart each."""
    frames = {n: r.streams[stream] for n, r in training.items() if "step" in r.streams.get(stream, pd.DataFrame())}
    columns = [c for c in plots.numeric_series(frames) if c.startswith(prefix)]
    if not columns:
        st.info(f"No `{prefix}*` logged in `{stream}` yet.")
        return
    st.markdown(f"**{title}**")
    cells = st.columns(min(3, len(columns)))
    for i, column in enumerate(columns):
        data = plots.over_time(frames, [column])
        with cells[i % len(cells)]:
            st.plotly_chart(plots.lines(data, [column], title=column, y_title=column, colors=colors),
                            key=f"mtp_{stream}_{column}")


if training:
    st.subheader("Head training")
    stream_lines("train", "mtp/", "Training loss and d_TV per step")
    stream_lines("eval", "mtp/eval/", "Held-out evaluation")

for name, run in evaluating.items():
    st.subheader(f"Evaluation `{name}`")
    table2 = run.path / "table2.csv"
    if table2.exists():
        st.markdown("**Table 2**: RS acceptance (%) at the temperature nearest 1, heads × tasks")
        st.dataframe(pd.read_csv(table2), hide_index=True)
    elif run.state == "running":
        st.info("Table 2 is written when the sweep ends.", icon=":material/hourglass_empty:")
    tokens = run.streams.get("tokens")
    if tokens is None or tokens.empty:
        st.info("No per-token records yet.")
        continue
    points = state.eval_points({name: run})
    st.plotly_chart(plots.acceptance_vs_entropy(points, y_title="acceptance rate (accepted / reached drafts)"),
                    key=f"mtp_law_{name}")
    st.dataframe(plots.entropy_fits(points), hide_index=True, width="stretch",
                 column_config=state.column_titles(plots.entropy_fits(points), {"slope": "%+.3f", "r2": "%.3f"}))
