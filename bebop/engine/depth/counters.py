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
        if choice.gamma > 0 and choice.expected_accepted is not None:
            # The decision expected E[accepted] per row (every row at γ, or each at its own depth: their mean).
            out["spec/num_predicted_accepted_tokens"] += choice.expected_accepted * choice.rows
        cell = f"engine/cost/{choice.bucket}/{choice.gamma}"
        out[f"{cell}/steps"] = out.get(f"{cell}/steps", 0) + 1
        out[f"{cell}/seconds"] = out.get(f"{cell}/seconds", 0.0) + seconds
        if choice.depths is not None:
            _row_counters(out, choice, seconds, max_gamma)
    return out


def _row_counters(out: dict, choice: Choice, seconds: float, max_gamma: int) -> None:
    """A per-row choice's counters (gamma="rows"): `spec/num_row_depth/{d}` row-steps at each depth d,
    `spec/num_lookup_row_steps` of them drafted by prompt lookup, `spec/num_budget_tokens` the verify tokens the
    steps' budgets allowed (rows + drafts), and `engine/priced_steps/{predicted,measured}_s` the seconds the cost
    model predicted for the steps it priced beside what they took."""
    for d in range(max_gamma + 1):
        out.setdefault(f"spec/num_row_depth/{d}", 0)
    for d in choice.depths:
        out[f"spec/num_row_depth/{d}"] += 1
    out["spec/num_lookup_row_steps"] = out.get("spec/num_lookup_row_steps", 0) + sum(choice.lookup or ())
    out["spec/num_budget_tokens"] = out.get("spec/num_budget_tokens", 0) + choice.budget
    if choice.cost_s is not None:
        out["engine/priced_steps/predicted_s"] = out.get("engine/priced_steps/predicted_s", 0.0) + choice.cost_s
        out["engine/priced_steps/measured_s"] = out.get("engine/priced_steps/measured_s", 0.0) + seconds
