"""A run's setup: what a run is, in one vocabulary for every job (meta.json's top-level keys, docs/runs.md).

Every job writes them through `setup_keys` (RL, its synthetic preview, eval-mtp, train-mtp) and the dashboard reads
them through `run_setup`, so the schema has one owner both ways. A value is one setting, a list where a job sweeps
several (eval-mtp's methods, train-mtp's tasks), or None where the run has no such thing (a plain-decoding run has no
head, no strategy and no depth).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

SETUP_KEYS = ("task", "rollout", "mtp_objective", "mtp_strategy", "gamma", "mode")


def one_or_all(values: Iterable) -> Any:
    """A sweep's distinct values in order: the value itself when there is one, else the list."""
    values = list(dict.fromkeys(values))
    return values[0] if len(values) == 1 else values


def setup_keys(*, task: Any, rollout: Any, mtp_objective: Any, mtp_strategy: Any, gamma: Any, mode: Any) -> dict:
    """meta.json's setup keys (pass them as `meta_extra`); every key must be given, None where it does not apply."""
    return {"task": task, "rollout": rollout, "mtp_objective": mtp_objective, "mtp_strategy": mtp_strategy,
            "gamma": gamma, "mode": mode}


def rl_setup(*, task: str, rollout: str, mode: str, mtp_objective: str | None, mtp_strategy: str, gamma: Any) -> dict:
    """An RL run's setup keys: a run without drafts (rollout "none") has no head, strategy or depth."""
    speculative = rollout != "none"
    return setup_keys(task=task, rollout=rollout, mode=mode, mtp_objective=mtp_objective if speculative else None,
                      mtp_strategy=mtp_strategy if speculative else None, gamma=gamma if speculative else None)


def run_setup(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The run's setup (`SETUP_KEYS`) from its meta.json; None where the run has no such thing.

    Jobs write these keys at the top of meta.json. Runs written before they did are read from where their
    job kept the same facts: an RL config's `mtp` (the strategy) and meta's `head`, or a config's `tasks`.
    """
    if all(key in meta for key in SETUP_KEYS):
        return {key: meta[key] for key in SETUP_KEYS}
    config = meta.get("config") if isinstance(meta.get("config"), Mapping) else {}
    setup = {key: meta.get(key, config.get(key)) for key in SETUP_KEYS}
    if setup["task"] is None and config.get("tasks"):
        setup["task"] = config["tasks"]
    if meta.get("kind") == "rl" and config.get("rollout") == "none":
        setup.update(mtp_objective=None, mtp_strategy=None, gamma=None)
    elif meta.get("kind") == "rl":
        setup["mtp_strategy"] = setup["mtp_strategy"] or config.get("mtp")
        setup["mtp_objective"] = setup["mtp_objective"] or meta.get("head")
    return setup
