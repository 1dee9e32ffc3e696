"""MTP heads: the runs that train heads (`bebop train-mtp`) and that evaluate them (`bebop eval-mtp`, PAPER Table 2)."""

import re

import pandas as pd
import streamlit as st

from bebop import plots
from bebop.app import state

READABLE = {"mtp/d_tv_mean": "d_TV(p, q), mean over positions", "mtp/grad_norm": "gradient norm",
            "mtp/eval/d_tv_mean": "held-out d_TV(p, q), mean over positions",
            "mtp/eval/accept_length_tf": "held-out accept length (teacher-forced)"}

root, infos, chosen, message = state.selected()
state.title("MTP heads", chosen)
kinds = ("train-mtp", "eval-mtp")
picked = [info for info in chosen if info.kind in kinds]
if not picked:
    others = [state.label(info, root) for info in infos if info.kind in kinds]
    hint = f" Under this root: {', '.join(f'`{n}`' for n in others)}." if others else ""
    st.info(message or f"Pick a `bebop train-mtp` or `bebop eval-mtp` run in the sidebar.{hint}", icon=":material/info:")
    st.stop()
state.note_made_by({state.label(info, root): info.meta for info in picked})
runs = state.load_runs(picked, root)
training = {name: run for name, run in runs.items() if run.meta.get("kind") == "train-mtp"}
evaluating = {name: run for name, run in runs.items() if run.meta.get("kind") == "eval-mtp"}
# A head is named by its run and the loss it was trained with, which is what the charts compare.
heads = {name: f"{name} · {run.meta.get('mtp_objective') or '?'} loss" for name, run in training.items()}
colors = {heads[name]: color for name, color in state.run_colors(training).items()}


def title(column: str) -> str:
    """A logged series' readable name; draft positions count from 1, as on the Live page."""
    if match := re.fullmatch(r"mtp/(eval/)?d_tv_pos/(\d+)", column):
        return f"{'held-out ' if match.group(1) else ''}d_TV(p, q) at draft position {int(match.group(2)) + 1}"
    if column.startswith("mtp/loss/"):
        return f"training loss ({column.removeprefix('mtp/loss/')})"
    return READABLE.get(column, column)


def stream_lines(stream: str, prefix: str, heading: str) -> None:
    """Every `prefix*` series of `stream` in the training runs, one chart each."""
    frames = {heads[n]: r.streams[stream] for n, r in training.items()
              if "step" in r.streams.get(stream, pd.DataFrame())}
    columns = [c for c in plots.numeric_series(frames) if c.startswith(prefix)]
    if not columns:
        st.info(f"No `{prefix}*` logged in `{stream}` yet.")
        return
    st.markdown(f"**{heading}**")
    cells = st.columns(min(3, len(columns)))
    for i, column in enumerate(columns):
        data = plots.over_time(frames, [column])
        with cells[i % len(cells)]:
            st.plotly_chart(plots.lines(data, [column], title=title(column), y_title=title(column), colors=colors,
                                        x_title="train-mtp step"), key=f"mtp_{stream}_{column}")
            state.download(data, f"{stream}_{column.replace('/', '_')}.csv", key=f"dl_mtp_{stream}_{column}")


if training:
    st.subheader("Head training")
    stream_lines("train", "mtp/", "Training loss and d_TV per step")
    stream_lines("eval", "mtp/eval/", "Held-out evaluation")

for name, run in evaluating.items():
    st.subheader(f"Evaluation `{name}`")
    table2 = run.path / "table2.csv"
    if table2.exists():
        st.markdown("**Table 2**: RS acceptance (%) at the temperature nearest 1, heads × tasks")
        state.show_table(pd.read_csv(table2))
    elif run.state == "running":
        st.info("Table 2 is written when the sweep ends.", icon=":material/hourglass_empty:")
    tokens = run.streams.get("tokens")
    if tokens is None or tokens.empty:
        st.info("No per-token records yet.")
        continue
    points = state.eval_points({name: run})
    st.plotly_chart(plots.acceptance_vs_entropy(points, y_title="acceptance rate (accepted / reached drafts)"),
                    key=f"mtp_law_{name}")
    state.show_table(plots.entropy_fits(points), {"slope": "%+.3f", "intercept": "%.3f", "r2": "%.3f"},
                     helps={"n": "points the line is fitted to"})
