"""Counters of a rollout whose steps ran at mixed draft depths (`GenerationConfig(gamma="auto")`): the verify steps
pooled over depths, and the depth controller's decisions (bebop.engine.depth)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from bebop.engine.depth import Choice
from bebop.metrics import SpecCounters


def spec_counts(verdicts: list[list[float]], gamma: int, method: str) -> dict:
    """`SpecCounters` of verify steps at depth γ from their rows' [num_accepted, H(p_1..p_γ)]."""
    counters = SpecCounters(gamma=gamma, method=method)
    if verdicts:
        table = torch.tensor(verdicts, dtype=torch.float64)  # [N, 1+γ]
        counters.update(table[:, 0].long(), table[:, 1:], validate=False)
    return counters.to_dict()


def depth_counters(choices: list[tuple[Choice, float]], max_gamma: int) -> dict[str, float | int]:
    """The depth controller's decisions as counters (sums, so they pool over rollouts and RL steps):
    `spec/num_gamma_chosen/{γ}` steps at each depth, `spec/num_probe_steps` those chosen to measure a cell,
    `spec/num_predicted_accepted_tokens` the accepted drafts the decisions expected (compare
    `spec/num_accepted_tokens`), and `engine/cost/{rows}/{γ}/{steps,seconds}` the steps measured per cost-table
    cell (rows: its bucket, `bebop.engine.depth.row_bucket`)."""
    out: dict[str, float | int] = {f"spec/num_gamma_chosen/{g}": 0 for g in range(max_gamma + 1)}
    out["spec/num_probe_steps"], out["spec/num_predicted_accepted_tokens"] = 0, 0.0
    for choice, seconds in choices:
        out[f"spec/num_gamma_chosen/{choice.gamma}"] += 1
        out["spec/num_probe_steps"] += int(choice.probe)
        if choice.gamma > 0:
            # Every row of the step drafted; the decision expected E[accepted | γ] of each.
            out["spec/num_predicted_accepted_tokens"] += choice.expected_accepted * choice.rows
        cell = f"engine/cost/{choice.bucket}/{choice.gamma}"
        out[f"{cell}/steps"] = out.get(f"{cell}/steps", 0) + 1
        out[f"{cell}/seconds"] = out.get(f"{cell}/seconds", 0.0) + seconds
    return out


def pool_depths(counts: Sequence[Mapping]) -> dict[str, float | int | str]:
    """Counters of verify steps at several depths (one `SpecCounters.to_dict()` per γ, one method) as one counter
    dict at the deepest γ: sums, a position a depth never drafted counting 0, plus the drafts that reached each
    position, `spec/num_reached_tokens_per_pos/{i}` (which `derive` then divides by: with mixed depths a draft that
    accepted i-1 reached i only if its step drafted that deep)."""
    if not counts:
        raise ValueError("counts is empty: pass at least one SpecCounters.to_dict()")
    methods = {str(c["spec/method"]) for c in counts}
    if len(methods) > 1:
        raise ValueError(f"cannot pool counters of different methods: {sorted(methods)}")
    depth = max(int(c["spec/gamma"]) for c in counts)
    out: dict[str, float | int | str] = {"spec/gamma": depth, "spec/method": methods.pop()}
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        out[f"spec/{key}"] = sum(c[f"spec/{key}"] for c in counts)
    for i in range(depth):
        out[f"spec/num_accepted_tokens_per_pos/{i}"] = sum(c.get(f"spec/num_accepted_tokens_per_pos/{i}", 0)
                                                          for c in counts)
        out[f"spec/num_reached_tokens_per_pos/{i}"] = sum(
            (c["spec/num_drafts"] if i == 0 else c[f"spec/num_accepted_tokens_per_pos/{i - 1}"])
            for c in counts if i < int(c["spec/gamma"]))
    for c in counts:
        for key, value in c.items():
            if key.startswith("spec/by_entropy/"):
                out[key] = out.get(key, 0) + value
    return out
