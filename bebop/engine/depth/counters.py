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
    steps' budgets allowed (rows + drafts), and `engine/priced_steps/*`, for the steps the cost model priced: the
    seconds it predicted beside what they took (`predicted_s`, `measured_s`), a plain step's price (`plain_s`), their
    rows and the tokens it expected (`predicted_tokens`): what `predicted_speedup` reads."""
    for d in range(max_gamma + 1):
        out.setdefault(f"spec/num_row_depth/{d}", 0)
    for d in choice.depths:
        out[f"spec/num_row_depth/{d}"] += 1
    out["spec/num_lookup_row_steps"] = out.get("spec/num_lookup_row_steps", 0) + sum(choice.lookup or ())
    out["spec/num_budget_tokens"] = out.get("spec/num_budget_tokens", 0) + choice.budget
    if choice.cost_s is not None and choice.plain_s is not None:
        priced = {"predicted_s": choice.cost_s, "measured_s": seconds, "plain_s": choice.plain_s, "rows": choice.rows,
                  "predicted_tokens": choice.rows + choice.expected_accepted * choice.rows}
        for key, value in priced.items():
            out[f"engine/priced_steps/{key}"] = out.get(f"engine/priced_steps/{key}", 0.0) + value


def predicted_speedup(stats: dict) -> float | None:
    """The speedup over plain decoding the per-row cost model predicted for the steps it priced: their predicted
    tokens over predicted seconds, against their rows over the plain step's price (None: no step priced)."""
    key = "engine/priced_steps/{}".format
    if not stats.get(key("predicted_s")) or not stats.get(key("rows")):
        return None
    return (stats[key("predicted_tokens")] / stats[key("predicted_s")]) / (stats[key("rows")] / stats[key("plain_s")])
