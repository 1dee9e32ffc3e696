"""Runs: every run under the root with its state, what it is (task, rollout, MTP loss and strategy), and its config."""

import streamlit as st

from bebop.app import state

root, infos, chosen, message = state.selected()
st.title("Runs")
st.caption(f"Runs root: `{root}`")
if message:
    st.info(message, icon=":material/info:")
    st.stop()

table = state.runs_table(infos, root)
counts = table["state"].value_counts()
cols = st.columns(4)
for col, name in zip(cols, ("running", "finished", "failed", "stale")):
    col.metric(name, int(counts.get(name, 0)), border=True)

# A heartbeat only for runs still writing, a message only where a run left one: columns no run fills are left out.
empty = [c for c in ("heartbeat_age_s", "message") if not any(v not in ("", None) and v == v for v in table[c])]
state.show_table(table.drop(columns=empty), {"step": "%d", "heartbeat_age_s": "%.0f s"},
                 helps={"heartbeat_age_s": "seconds since a running run last wrote status.json"})
state.download(table, "runs.csv", key="dl-runs")

st.subheader("Configs")
for info in infos:
    name = state.label(info, root)
    with st.expander(f"{name} · {info.kind} · {state.badge(info.state)}"):
        if info.message:
            (st.error if info.state == "failed" else st.caption)(info.message)
        st.json(info.config, expanded=2)
