"""The depth controller's decisions as counters of a rollout (`GenerationConfig(gamma="auto")`), beside the verify
counters `bebop.engine.rollout.decode_stats` pools over the depths that ran."""

from __future__ import annotations

from bebop.engine.depth.choice import Choice


def depth_counters(choices: list[tuple[Choice, float, int]], max_gamma: int) -> dict[str, float | int]:
    """The depth controller's decisions, each step's (Choice, seconds, accepted drafts over its rows), as counters
    (sums, so they pool over rollouts and RL steps):
    `spec/num_gamma_chosen/{γ}` steps at each depth, `spec/num_probe_steps` those chosen to measure a cell,
    `spec/num_predicted_accepted_tokens` the accepted drafts the decisions expected (compare
    `spec/num_accepted_tokens`), and `engine/cost/{rows}/{γ}/{steps,seconds}` the steps measured per cost-table
    cell (rows: its bucket, `bebop.engine.depth.row_bucket`)."""
    out: dict[str, float | int] = {f"spec/num_gamma_chosen/{g}": 0 for g in range(max_gamma + 1)}
    out["spec/num_probe_steps"], out["spec/num_predicted_accepted_tokens"] = 0, 0.0
    for choice, seconds, accepted in choices:
        out[f"spec/num_gamma_chosen/{choice.gamma}"] += 1
        out["spec/num_probe_steps"] += int(choice.probe)
        if choice.gamma > 0 and choice.expected_accepted is not None:
            # The decision expected E[accepted] per row (every row at γ, or each at its own depth: their mean).
            out["spec/num_predicted_accepted_tokens"] += choice.expected_accepted * choice.rows
        cell = f"engine/cost/{choice.bucket}/{choice.gamma}"
        out[f"{cell}/steps"] = out.get(f"{cell}/steps", 0) + 1
        out[f"{cell}/seconds"] = out.get(f"{cell}/seconds", 0.0) + seconds
        if choice.depths is not None:
            _row_counters(out, choice, seconds, accepted, max_gamma)
    return out


def _row_counters(out: dict, choice: Choice, seconds: float, accepted: int, max_gamma: int) -> None:
    """A per-row choice's counters (gamma="rows"): `spec/num_row_depth/{d}` row-steps at each depth d,
    `spec/num_lookup_row_steps` of them drafted by prompt lookup, `spec/num_budget_tokens` the verify tokens the
    steps' budgets allowed (rows + drafts), and `engine/priced_steps/*`, for the steps the cost model priced: the
    seconds it predicted beside what they took (`predicted_s`, `measured_s`), a plain step's price (`plain_s`), their
    rows, and the tokens it expected beside those emitted (`predicted_tokens`, `measured_tokens`): what
    `predicted_speedup` and `prediction_split` read."""
    for d in range(max_gamma + 1):
        out.setdefault(f"spec/num_row_depth/{d}", 0)
    for d in choice.depths:
        out[f"spec/num_row_depth/{d}"] += 1
    out["spec/num_lookup_row_steps"] = out.get("spec/num_lookup_row_steps", 0) + sum(choice.lookup or ())
    out["spec/num_budget_tokens"] = out.get("spec/num_budget_tokens", 0) + choice.budget
    if choice.cost_s is not None and choice.plain_s is not None:
        priced = {"predicted_s": choice.cost_s, "measured_s": seconds, "plain_s": choice.plain_s, "rows": choice.rows,
                  "predicted_tokens": choice.rows + choice.expected_accepted * choice.rows,
                  "measured_tokens": choice.rows + accepted}
        for key, value in priced.items():
            out[f"engine/priced_steps/{key}"] = out.get(f"engine/priced_steps/{key}", 0.0) + value


def predicted_speedup(stats: dict) -> float | None:
    """The speedup over plain decoding the per-row cost model predicted for the steps it priced: their predicted
    tokens over predicted seconds, against their rows over the plain step's price (None: no step priced)."""
    key = "engine/priced_steps/{}".format
    if not stats.get(key("predicted_s")) or not stats.get(key("rows")):
        return None
    return (stats[key("predicted_tokens")] / stats[key("predicted_s")]) / (stats[key("rows")] / stats[key("plain_s")])


def prediction_split(stats: dict, plain: dict | None = None) -> dict[str, float] | None:
    """Where `predicted_speedup` parts from what its steps did, as factors whose product is exact:

        predicted · tokens · seconds = priced
        tokens   the tokens its priced steps emitted over those it expected (the acceptance model)
        seconds  the seconds it predicted for them over those they took (the step-cost model)
        priced   their measured tokens/s over plain decoding's at the model's price of a plain step (`plain_s`)

    With `plain`, the stats of a plain run over the same prompts, on to the measured speedup, exactly too:

        priced · (1 - outside) · rest = loop
        outside  the share of this decode loop outside the priced steps' seconds (the head's catch-up after plain
                 steps, `catch_up` of it: a price of switching the step costs leave out; steps not priced; the
                 controller's own time)
        rest     the plain price against the plain run's steps (at one row, all of it), and the rows the steps ran
        loop     the plain run's decode-loop seconds per generated token over this one's (a call's wall time less
                 its prefill; per token, as rows that stop make different counts)

    and `call`, their wall times' per token (the prefill, which no depth speeds, included). None: no step priced."""
    predicted = predicted_speedup(stats)
    if predicted is None:
        return None
    get = lambda name: stats[f"engine/priced_steps/{name}"]  # noqa: E731
    tokens, seconds = get("measured_tokens") / get("predicted_tokens"), get("predicted_s") / get("measured_s")
    out = {"predicted": predicted, "tokens": tokens, "seconds": seconds, "priced": predicted * tokens * seconds}
    if plain is not None:
        loop = lambda s: s["wall_time_s"] - s["engine/prefill_s"]  # noqa: E731
        per_token = lambda seconds, s: seconds / s["num_generated_tokens"]  # noqa: E731
        out["loop"] = per_token(loop(plain), plain) / per_token(loop(stats), stats)
        out["call"] = per_token(plain["wall_time_s"], plain) / per_token(stats["wall_time_s"], stats)
        out["catch_up"] = stats.get("engine/catch_up_s", 0.0) / loop(stats)
        out["outside"] = 1 - get("measured_s") / loop(stats)
        out["rest"] = out["loop"] / (out["priced"] * (1 - out["outside"]))
    return out


def prediction_split_text(split: dict[str, float]) -> str:
    """`prediction_split` in one line, its factors in the order they multiply."""
    text = (f"predicted {split['predicted']:.2f}x plain, x tokens {split['tokens']:.2f} (emitted / expected) "
            f"x seconds {split['seconds']:.2f} (predicted / taken) = {split['priced']:.2f}x on its priced steps")
    if "loop" in split:
        text += (f" x (1 - {split['outside']:.1%} of the loop outside them, {split['catch_up']:.1%} the head's "
                 f"catch-up) x rest {split['rest']:.2f} (the plain price, the rows per step) = the decode loop "
                 f"{split['loop']:.2f}x; the call {split['call']:.2f}x")
    return text
