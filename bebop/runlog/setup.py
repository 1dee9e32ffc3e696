"""A run's setup: what a run is, in one vocabulary for every job (meta.json's top-level keys, docs/runs.md).

Every job writes them through `setup_keys` (RL, its synthetic preview, eval-mtp, train-mtp) and the dashboard reads
them through `run_setup`, so the schema has one owner both ways. A value is one setting, a list where a job sweeps
several (eval-mtp's methods, train-mtp's tasks), or None where the run has no such thing (a plain-decoding run has no
head, no strategy and no depth).

What made the run, meta.json's `policy` and `head` (written by `bebop.policy.run_meta`, which needs the models), is
read here for every page and the command line: `policy_of`, `head_of` (a table's cell) and `made_by` (one line).
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


# ---- what made a run: meta.json's `policy` and `head` (written by `bebop.policy.run_meta`) ------------------------
MISSING = "—"  # what a run that predates these keys shows


def policy_of(meta: Mapping[str, Any]) -> str:
    """The run's policy as a table names it: the name or path it was loaded by ("smollm2", "default", a directory, a
    hub id); a model built in memory by its size; "—" for a run that does not say."""
    policy = meta.get("policy")
    if isinstance(policy, Mapping):
        return str(policy.get("name") or f"unnamed {policy.get('parameters', 0) / 1e6:.1f}M-parameter model")
    return MISSING if policy is None else str(policy)


def head_of(meta: Mapping[str, Any]) -> str:
    """The run's head(s) as a table names them: the spec or directory each was loaded by ("lookup" for prompt
    lookup), "none" where the run drafted with no head, "—" for a run that does not say."""
    if "head" not in meta:
        return MISSING
    heads = _heads(meta["head"])
    return ", ".join(_head_name(head) for head in heads) if heads else "none"


SYNTHETIC = "synthetic"  # how a simulated run (`bebop preview`, bebop.rl.synthetic) is marked wherever it is named


def is_synthetic(meta: Mapping[str, Any]) -> bool:
    """A run `bebop preview` simulated (bebop.rl.synthetic): no model ran, its numbers are made up."""
    return bool(meta.get("synthetic"))


def made_by(meta: Mapping[str, Any]) -> str:
    """The policy and head(s) in one line, with what each record holds: "policy smollm2 (134.5M parameters,
    bfloat16, weights 6b54f4a2) · head e2e_tv (e2e_tv loss, trained depth 5, whole vocabulary)"; a synthetic run
    says that it is one, and that no model made it."""
    if is_synthetic(meta):
        return (f"{SYNTHETIC.upper()}: simulated by `bebop preview` (bebop.rl.synthetic), no policy or head ran; its "
                "numbers illustrate the pages and measure nothing")
    policy = meta.get("policy")
    parts = [f"policy {policy_of(meta)}"]
    if isinstance(policy, Mapping):
        facts = [f"{policy['parameters'] / 1e6:.1f}M parameters" if policy.get("parameters") else None,
                 policy.get("dtype"), f"weights {policy['hash'][:8]}" if policy.get("hash") else None]
        parts[0] += f" ({', '.join(f for f in facts if f)})"
    elif isinstance(meta.get("policy_parameters"), int):  # an RL run from before: its size is all it says
        parts[0] += f" ({meta['policy_parameters'] / 1e6:.1f}M parameters)"
    if "head" in meta:
        heads = _heads(meta["head"])
        parts += [_head_text(head) for head in heads] if heads else ["no head (plain decoding)"]
    return " · ".join(parts)


def _heads(value: Any) -> list:
    """A `head` value as a list: a record, a list of them (a sweep), or a spec string (runs that wrote only that)."""
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def _head_name(head: Any) -> str:
    if not isinstance(head, Mapping):
        return str(head)
    return str(head.get("name") or head.get("objective") or "unnamed head")


def _head_text(head: Any) -> str:
    """One head with what its record holds (a spec string, from a run that wrote only that, holds nothing more)."""
    text = f"head {_head_name(head)}"
    if not isinstance(head, Mapping):
        return text
    if head.get("kind") == "lookup":
        return f"{text} (prompt lookup: no weights)"
    vocab = head.get("draft_vocab")
    facts = [f"{head['objective']} loss" if head.get("objective") else None,
             f"trained depth {head['depth']}" if head.get("depth") else None,
             "whole vocabulary" if vocab is None else f"draft vocabulary {vocab:,}"]
    return f"{text} ({', '.join(f for f in facts if f)})"
