"""Live: the selected runs as they train, each panel redrawing itself every few seconds.

Each panel is its own `st.fragment(run_every=...)`, so a redraw touches only that panel, and reads only
the bytes appended to the run's streams since the previous redraw (the `Run`s live in the session).
"""

import time

import pandas as pd
import streamlit as st

from bebop import metrics, plots, speedup
from bebop.app import alerts, state

root, infos, chosen, message = state.selected()
state.title("Live", chosen)
if not chosen:
    st.info(message or "Pick one or more runs in the sidebar.", icon=":material/info:")
    st.stop()

state.note_made_by({state.label(info, root): info.meta for info in chosen})
c1, c2, c3, c4, c5 = st.columns([1.1, 1.1, 2, 1.8, 2], vertical_alignment="bottom")
paused = c1.toggle("Pause", key="live_paused", help="stop refreshing (zoom and hover stay)")
every = c2.selectbox("Refresh every", (2, 5, 10, 30, 60), index=1, format_func=lambda s: f"{s} s", key="live_every")
x = c3.segmented_control("x-axis", list(plots.X_AXES), default="step", key="live_x",
                         format_func=str.capitalize) or "step"
smoothing = c4.slider("Smoothing", 0.0, 0.95, 0.6, 0.05, key="live_smoothing",
                      help="EMA weight of a faint trend line; the data stay drawn in full")
# The entropy law opens on the view whose fit the data support better (said above the chart); a user's choice stays.
if "live_by" not in st.session_state:
    st.session_state["live_by"] = state.better_law_view(state.load_runs(chosen, root, notify=False))
by = c5.segmented_control("Entropy-law points", ("step", "bin"), key="live_by",
                          format_func={"step": "per RL step", "bin": "per entropy bin"}.get) or "step"
run_every = None if paused else every
st.caption(f"{len(chosen)} run(s) · " + ("paused" if paused else f"refreshing every {every} s"))
colors = state.run_colors(state.label(info, root) for info in chosen)


def recent(train, rows: int = 10) -> dict:
    """Pooled rates over the last `rows` steps: what the run does now, not on average."""
    tail = train.tail(rows)
    return metrics.derive(plots.pooled(tail)) if plots.has_spec(tail) else {}


@st.fragment(run_every=run_every)
def headline() -> None:
    runs = state.load_runs(chosen, root)
    alerts.show_warnings({name: alerts.run_warnings(name, run) for name, run in runs.items()})
    trains = state.trains(runs)
    now = time.time()
    rows = []
    for name, run in runs.items():
        train = trains.get(name, pd.DataFrame())
        last = train.iloc[-1] if len(train) else pd.Series(dtype=object)
        heartbeat = run.status.get("heartbeat")
        timing = speedup.step_stats(train.to_dict("records")) if len(train) else {}
        rows.append({
            "run": name, "state": run.state, "step": last.get("step"),
            "accept length (last 10)": recent(train).get(plots.ACCEPT_LENGTH) if len(train) else None,
            "policy entropy (last step)": last.get("actor/entropy"),
            "reward (last step)": last.get("critic/score/mean"), speedup.STEP_TIME: timing.get("step_s"),
            speedup.TOKENS_PER_S: timing.get("tokens_per_s"),
            "heartbeat": f"{now - heartbeat:.0f} s ago"
            if isinstance(heartbeat, (int, float)) and run.state in ("running", "stale") else None,
        })
    table = pd.DataFrame(rows)
    if not table["heartbeat"].notna().any():  # nothing running: no column of blanks
        table = table.drop(columns="heartbeat")
    state.show_table(table, {"policy entropy (last step)": "%.3f", "reward (last step)": "%.3f",
                             "accept length (last 10)": "%.2f", speedup.STEP_TIME: "%.2f",
                             speedup.TOKENS_PER_S: "%.0f", "step": "%d"},
                     helps={"accept length (last 10)": "pooled over the last 10 steps, at the depth the engine chose "
                                                       "(the Shadow heads page scores every head at one depth)",
                            "policy entropy (last step)": "nats", "reward (last step)": "mean task reward",
                            speedup.STEP_TIME: f"the whole step, {speedup.STATISTIC}",
                            speedup.TOKENS_PER_S: f"generated tokens per second of generation, {speedup.STATISTIC}"})
    state.note_spec_gaps(trains)


@st.fragment(run_every=run_every)
def entropy_law() -> None:
    runs = state.load_runs(chosen, root, notify=False)
    points, y_title = state.entropy_points(runs, by=by)
    if points.empty:
        st.info("No speculative rollouts among the selected runs yet: acceptance needs MTP (rollout TO or RS).")
        return
    st.caption(state.law_views_caption(runs, by))
    scored = [name for name, run in runs.items() if len(run.streams.get("shadow", ()))]
    if scored:  # the rollout's acceptance is at the depth the engine chose; the heads compare at one depth elsewhere
        st.caption(f":material/stacked_line_chart: Here the acceptance is the rollout's, at the depth the engine chose "
                   f"each step. {', '.join(f'`{n}`' for n in scored)} scored every head on the same rollouts at one "
                   "depth: the Shadow heads page draws each one's law.")
    st.plotly_chart(plots.acceptance_vs_entropy(points, colors=colors, y_title=y_title), key="live_entropy_law")
    fits = plots.entropy_fits(points)
    left, right = st.columns([4, 1])
    with left:
        state.show_table(fits, {"slope": "%+.3f", "intercept": "%.3f", "r2": "%.3f"},
                         helps={"n": "points the line is fitted to"})
    with right:
        state.download(points, "acceptance_vs_entropy.csv", key="dl_live_entropy_law")


@st.fragment(run_every=run_every)
def acceptance() -> None:
    trains = state.trains(state.load_runs(chosen, root, notify=False), notify=False)
    left, right = st.columns(2)
    data = plots.over_time(trains, [plots.ACCEPT_LENGTH], x=x)
    with left:
        if data.empty:
            st.info("No accept length yet (runs without MTP have none).")
        else:
            st.plotly_chart(plots.lines(data, [plots.ACCEPT_LENGTH], x=x, smoothing=smoothing,
                                        title="Accept length (at the depth the engine chose)",
                                        y_title="tokens / verify step", colors=colors, from_zero=True),
                            key="live_accept_length")
            state.download(data, "accept_length.csv", key="dl_live_accept_length")
    gammas = [int(t["spec/gamma"].dropna().max()) for t in trains.values() if plots.has_spec(t)]
    columns = [f"spec/acceptance_rate_pos/{i}" for i in range(min(gammas, default=0))]
    data = plots.over_time(trains, columns, x=x) if columns else data.iloc[0:0]
    with right:
        if data.empty:
            st.info("No per-position acceptance yet.")
        else:
            labels = {c: f"pos {int(c.rsplit('/', 1)[1]) + 1}" for c in columns}
            st.plotly_chart(plots.lines(data, columns, title="Acceptance per draft position", x=x, smoothing=smoothing,
                                        y_title="accepted at i / drafts", colors=colors, labels=labels,
                                        from_zero=True),
                            key="live_positions")
            state.download(data, "acceptance_per_position.csv", key="dl_live_positions")


@st.fragment(run_every=run_every)
def policy() -> None:
    trains = state.trains(state.load_runs(chosen, root, notify=False), notify=False)
    panels = (("actor/entropy", "Policy entropy", "H(p) (nats)"), ("critic/score/mean", "Reward", "mean task reward"))
    for col, (column, title, y_title) in zip(st.columns(2), panels):
        data = plots.over_time(trains, [column], x=x)
        with col:
            if data.empty:
                st.info(f"No `{column}` logged yet.")
                continue
            st.plotly_chart(plots.lines(data, [column], title=title, x=x, smoothing=smoothing, y_title=y_title,
                                        colors=colors, from_zero=True), key=f"live_{column}")
            state.download(data, f"{column.replace('/', '_')}.csv", key=f"dl_live_{column}")


@st.fragment(run_every=run_every)
def row_depths() -> None:
    """gamma="rows": the depth each row got per RL step, and the verify-token budget (bebop.engine.depth.rows)."""
    trains = state.trains(state.load_runs(chosen, root, notify=False), notify=False)
    state.show_row_depths(trains, colors, "live")


headline()
st.divider()
entropy_law()
acceptance()
row_depths()
policy()
