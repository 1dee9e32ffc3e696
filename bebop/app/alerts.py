"""A run's warnings as the dashboard shows them: the stored ones, with the draft-health alarms replayed by the current
monitor (`bebop.rl.draft_health.replay`) so an older run reads as the monitor reads now."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from bebop.app.state import is_number
from bebop.rl.draft_health import replay
from bebop.runlog import Run

_HEALTH = "_bebop_health"  # session key: {(run label, train rows): the train stream, draft health replayed}


def show_warnings(named: Mapping[str, list[Mapping]], shown: int = 3) -> None:
    """One alert per run that raised warnings ({label: its `warnings` records}): how many, and the latest `shown`
    with their steps."""
    for name, records in named.items():
        if not records:
            continue
        lines = [f"- {_at_step(r.get('step'))}{r.get('message', '')}" for r in records[-shown:]]
        earlier = len(records) - len(lines)
        st.warning(f"`{name}` raised {len(records)} warning{'s' * (len(records) > 1)}"
                   + (f" (the latest {len(lines)}; all in its warnings.jsonl)" if earlier else "") + ":\n"
                   + "\n".join(lines), icon=":material/warning:")


def health(name: str, train: pd.DataFrame) -> pd.DataFrame:
    """`train` with its `draft_health/*` fields replayed by the current monitor (`bebop.rl.draft_health.replay`), so a
    run written before the alarm read its sign or bootstrapped its steps reads as the monitor reads now. Kept in the
    session per run and length: a live page redraws without replaying."""
    cache: dict = st.session_state.setdefault(_HEALTH, {})
    key = (name, len(train))
    if key not in cache:
        replayed = pd.DataFrame(replay(train.to_dict("records")), index=train.index)
        cache[key] = pd.concat([train.drop(columns=[c for c in train.columns if c.startswith("draft_health/")]),
                                replayed], axis=1)
    return cache[key]


def run_warnings(name: str, run: Run) -> list[dict]:
    """The run's warnings as its page shows them: the stored ones but the draft-health alarms, which are replayed
    (`health`): one per stretch of alarmed steps, where it starts."""
    stored = [w for w in (run.streams["warnings"].to_dict("records") if "warnings" in run.streams else [])
              if w.get("source") != "draft_health"]
    train = run.streams.get("train")
    if train is None or "step" not in train.columns or not len(train):
        return stored
    replayed, alarmed = [], False
    for record in health(name, train).to_dict("records"):
        alarm = record.get("draft_health/alarm") == 1.0
        if alarm and not alarmed:
            replayed.append({"step": record["step"], "source": "draft_health",
                             "message": record["draft_health/warning"]})
        alarmed = alarm
    return sorted(stored + replayed, key=lambda w: w.get("step", -1) if is_number(w.get("step")) else -1)


def _at_step(step: Any) -> str:
    return f"step {int(step)}: " if is_number(step) and not np.isnan(step) else ""
