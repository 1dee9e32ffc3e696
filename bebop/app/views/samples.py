"""Samples: a rollout's text, each token coloured by where it came from, with its entropy on hover."""

import streamlit as st

from bebop import plots
from bebop.app import state

runs = state.open_page("Samples", "Pick a run in the sidebar.")
with_samples = [name for name, run in runs.items()
                if "samples" in run.streams and "step" in run.streams["samples"].columns]
if not with_samples:
    st.info("None of the selected runs has logged samples yet.", icon=":material/hourglass_empty:")
    st.stop()

c1, c2, c3 = st.columns([2, 3, 1])
name = c1.selectbox("Run", with_samples, key="samples_run")
state.note_made_by({name: runs[name].meta})
samples = runs[name].streams["samples"]
steps = sorted(samples["step"].dropna().unique().tolist())
step = c2.select_slider("Step", steps, value=steps[-1], key=f"samples_step_{name}") if len(steps) > 1 else steps[0]
at_step = samples[samples["step"] == step].reset_index(drop=True)
index = c3.number_input("Sample", 0, len(at_step) - 1, 0, key=f"samples_index_{name}") if len(at_step) > 1 else 0
sample = at_step.iloc[int(index)].to_dict()

try:
    tokens = plots.sample_tokens(sample)
except ValueError as err:
    st.warning(f"This sample cannot be shown: {err}", icon=":material/warning:")
    st.stop()
counts = tokens["origin"].value_counts()
cols = st.columns(5)
reward = sample.get("reward")
cols[0].metric("reward", f"{reward:.3f}" if isinstance(reward, (int, float)) else "—")
for col, origin in zip(cols[1:], plots.ORIGIN_COLORS):
    col.metric(origin, int(counts.get(origin, 0)))

st.markdown(f"**Prompt:** {sample.get('prompt', '')}")
legend = " ".join(f'<span style="background:{c}33;border-bottom:3px solid {c};padding:0 4px">{o}</span>'
                  for o, c in plots.ORIGIN_COLORS.items())
st.html(f'<div style="margin:0.25rem 0 0.5rem 0">{legend} <span style="color:#777">· hover a token for its entropy</span></div>')
st.html(plots.sample_html(tokens))
st.plotly_chart(plots.token_figure(tokens), key="samples_tokens")
state.download(tokens, f"sample_{name.replace('/', '_')}_step{step}_{index}.csv", key="dl_samples_tokens")
