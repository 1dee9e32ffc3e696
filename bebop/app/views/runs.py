"""Runs: every run under the root with its state, what made it (policy, head), what it is (task, rollout, MTP loss and
strategy), the warnings it raised, and its config."""

import streamlit as st

from bebop.app import alerts, state

root, infos, chosen, message = state.selected()
state.title("Runs", infos)
st.caption(f"Runs root: `{root}`")
if message:
    st.info(message, icon=":material/info:")
    st.stop()

# Draft-health alarms as the current monitor reads them (replayed): a run's stored text may predate it.
warned = {state.label(info, root): info for info in infos if info.warnings}
replayed = state.load_runs([info for info in warned.values()
                            if any(w.get("source") == "draft_health" for w in info.warnings)], root, notify=False)
warnings = {name: alerts.run_warnings(name, replayed[name]) if name in replayed else info.warnings
            for name, info in warned.items()}
alerts.show_warnings(warnings)
table = state.runs_table(infos, root, {name: len(records) for name, records in warnings.items()})
counts = table["state"].value_counts()
cols = st.columns(4)
for col, name in zip(cols, ("running", "finished", "failed", "stale")):
    col.metric(name, int(counts.get(name, 0)), border=True)

# A heartbeat only for runs still writing, a message or warnings only where a run left some: columns no run fills are
# left out.
empty = [c for c in ("heartbeat_age_s", "message", "warnings")
         if not any(v not in ("", None) and v == v for v in table[c])]
state.show_table(table.drop(columns=empty), {"step": "%d", "heartbeat_age_s": "%.0f s", "warnings": "%d"},
                 helps={"heartbeat_age_s": "seconds since a running run last wrote status.json",
                        "policy": "the policy the run ran, by the name or path it was loaded by (meta.json's policy: "
                                  "also its weights' hash, dtype and size, under Configs)",
                        "head": "the MTP head(s) it drafted with (meta.json's head); none: plain decoding",
                        "warnings": "warnings the run raised (its warnings.jsonl), listed above the table"})
state.download(table, "runs.csv", key="dl-runs")

st.subheader("Configs")
for info in infos:
    name = state.label(info, root)
    with st.expander(f"{name} · {info.kind} · {state.badge(info.state)}"):
        if info.message:
            (st.error if info.state == "failed" else st.caption)(info.message)
        state.note_made_by({name: info.meta})
        st.json(info.config, expanded=2)
