"""The depth controller's decisions as counters of a rollout (`GenerationConfig(gamma="auto")`), beside the verify
counters `bebop.engine.rollout.decode_stats` pools over the depths that ran."""

from __future__ import annotations

from bebop.engine.depth.choice import Choice


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
