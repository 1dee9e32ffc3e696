"""Speedups of MTP decoding over plain decoding: which runs may be compared, the one statistic, the prediction.

A speedup is a ratio of two runs' seconds per step, so it means something only between runs that did the same work
and differ only in how they decoded: the same policy, task, rows per step (prompts x group), mode, token budget,
temperature, dtype, device and backend (`workload`, `differences`). A 32-row run divided by a 4-row one, or SmolLM2
by the tiny policy, is not a speedup, and nothing here computes one.

Every report (`bebop demo`, `bebop bench rl` through `bebop.rl.compare`, the dashboard's Speed page) reads a run's
seconds per step with the same statistic, `STATISTIC`: the median over its steady steps (`steady`), and pools the
engine's counters over the same steps.

The prediction (`Speedup.predicted`) is what the MTP run's measured costs imply for its decode loop: the tokens each
row gained per engine step divided by what one of its engine steps (drafts, verify, catch-up) cost in engine steps
of its plain partner, both timed by the engine over the same steady steps. It is a prediction, not a bound: prefill
and the Python around the loop are outside it, the two runs generated different tokens, and the steps of a shared
CPU vary, so a measurement can land on either side of it; one beyond it is flagged with the numbers that may explain
why (`Speedup.note`).

A speedup is credited to its cause (`Speedup.credit`): drafting changes generation only, so a whole-step speedup
larger than generation's came from outside it (the update, whose batches are the same in both runs, or the overlap
of an async step), and a run whose answers were shorter did less work, whatever it decoded with. Both are said
beside the number wherever it is shown (`bebop demo`, the Speed page).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bebop.metrics import ENGINE_COUNTERS, engine_step_costs

STATISTIC = "median over steady steps (all but each run's first and last)"
STEP_TIME = "s / step (median)"  # how every page and table names a step time read with STATISTIC
TOKENS_PER_S = "tokens / s (median)"  # generated tokens per second of generation, read the same way
# What two runs must share for their step times to be a speedup (the keys of `workload`), as a reader names them.
WORKLOAD = {"policy": "policy", "task": "task", "rows": "rows per step (prompts × group)", "mode": "mode",
            "max_new_tokens": "token budget", "temperature": "temperature", "dtype": "dtype", "device": "device",
            "backend": "backend", "world_size": "process count", "origin": "origin (synthetic or real)"}


def steady(records: Sequence[Mapping]) -> list[Mapping]:
    """The steps a timing statistic reads: all but the first (it compiles, allocates, and in async mode waits for a
    whole generation) and the last (in async mode it has no next generation to overlap). Two steps keep the second,
    one step itself."""
    return list(records[1:-1] or records[1:] or records)


def value(record: Mapping, key: str) -> float | None:
    """A record's number at `key`, None where it is missing or NaN (pandas fills absent columns with NaN)."""
    raw = record.get(key)
    if raw is None or isinstance(raw, (str, bool)):
        return None
    number = float(raw)
    return None if math.isnan(number) else number


def median(records: Sequence[Mapping], key: str) -> float:
    """`STATISTIC` of `key` (NaN when no steady step logged it)."""
    values = [v for r in steady(records) if (v := value(r, key)) is not None]
    return statistics.median(values) if values else math.nan


def total(records: Sequence[Mapping], key: str) -> float:
    """The sum of a counter over the steady steps."""
    return sum(v for r in steady(records) if (v := value(r, key)) is not None)


# ---- which runs may be compared --------------------------------------------------------------------------
def workload(meta: Mapping) -> dict:
    """What a run did apart from how it decoded, from its meta.json (None where the run does not say)."""
    config = meta.get("config") if isinstance(meta.get("config"), Mapping) else {}
    prompts, group = config.get("prompts_per_step"), config.get("group_size")
    return {
        "policy": policy_name(meta),
        "task": meta.get("task", config.get("task")),
        "rows": prompts * group if isinstance(prompts, int) and isinstance(group, int) else None,
        "mode": meta.get("mode", config.get("mode")),
        "max_new_tokens": config.get("max_new_tokens"),
        "temperature": config.get("temperature"),
        "dtype": config.get("dtype", config.get("gen_dtype")),  # gen_dtype: its name before
        "device": meta.get("device"),
        "backend": config.get("backend"),
        "world_size": meta.get("world_size"),
        "origin": "synthetic" if meta.get("synthetic") else "real",  # a simulated run is never anyone's partner
    }


def policy_name(meta: Mapping) -> str | None:
    """The policy as a reader names it: meta's `policy` (its name or path), else its parameter count."""
    policy = meta.get("policy")
    if isinstance(policy, Mapping):
        return str(policy.get("name") or policy.get("path") or policy.get("hash"))
    if policy is not None:
        return str(policy)
    count = meta.get("policy_parameters")
    return None if count is None else f"{count / 1e6:.1f}M parameters"


def same_policy(a: Mapping, b: Mapping) -> bool:
    """Whether two runs ran the same policy: by `policy` (its content hash where both have one) when both name it,
    else by parameter count; a run that says which policy it ran and one that says nothing are different models,
    two that both say nothing (synthetic runs, another loop's) are not told apart."""
    named = [meta.get("policy") for meta in (a, b)]
    if all(p is not None for p in named):
        hashes = [p.get("hash") if isinstance(p, Mapping) else None for p in named]
        return hashes[0] == hashes[1] if all(hashes) else named[0] == named[1]
    counts = [meta.get("policy_parameters") for meta in (a, b)]
    if all(c is not None for c in counts):
        return counts[0] == counts[1]
    return named == [None, None] and counts == [None, None]


# Settings older runs may not record: where one run does not say, it is not held against the pair.
UNRECORDED_OK = ("temperature", "dtype", "device", "backend", "world_size")


def differences(a: Mapping, b: Mapping) -> list[str]:
    """The `WORKLOAD` keys on which two runs differ: empty when one run's speedup over the other is one."""
    left, right = workload(a), workload(b)

    def differ(key: str) -> bool:
        if key == "policy":
            return not same_policy(a, b)
        if key in UNRECORDED_OK and (left[key] is None or right[key] is None):
            return False
        return left[key] != right[key]

    return [key for key in WORKLOAD if differ(key)]


def decodes_plainly(meta: Mapping) -> bool:
    """An RL run without MTP: what a speedup divides by."""
    config = meta.get("config") if isinstance(meta.get("config"), Mapping) else {}
    return meta.get("kind") == "rl" and meta.get("rollout", config.get("rollout")) == "none"


# ---- one pair's speedup and its prediction ----------------------------------------------------------------
@dataclass(frozen=True)
class Speedup:
    """MTP decoding over plain decoding for one pair of runs with the same `workload`, from their train records."""

    rollout: float  # the plain run's generation seconds per step over the MTP run's (STATISTIC)
    end_to_end: float  # the same for the whole step
    tokens_per_row_step: float  # 1 + accepted drafts per row and engine step, plain-decoded steps counted (NaN: none)
    step_cost: float  # an MTP engine step (drafts, verify, catch-up) in the plain run's engine steps (NaN: not logged)
    response_ratio: float  # the MTP run's mean response length over the plain run's (steady steps)
    spread: float  # the larger run's (max - min) / median of its steady generation seconds: the timing noise
    update: float = math.nan  # the plain run's update seconds per step over the MTP run's (STATISTIC)
    update_s: tuple[float, float] = (math.nan, math.nan)  # (plain, MTP) update seconds per step (STATISTIC)

    @property
    def predicted(self) -> float:
        """The decode loop's speedup that the measured costs predict (NaN without them)."""
        return self.tokens_per_row_step / self.step_cost if self.step_cost > 0 else math.nan

    @property
    def beyond(self) -> bool:
        """Whether the measured generation speedup exceeds the prediction."""
        return self.rollout > self.predicted  # False for NaN

    def note(self) -> str:
        """Why a measurement beyond the prediction may be (empty when it is not beyond): the reasons the numbers
        show, each with its size."""
        if not self.beyond:
            return ""
        gap = self.rollout / self.predicted - 1
        reasons = []
        if self.response_ratio < 0.97:  # a shorter response is less work per step, whatever the decoding
            reasons.append(f"its responses were {1 - self.response_ratio:.0%} shorter than the plain run's (less "
                           "work per step)")
        if self.spread > gap:
            reasons.append(f"generation times vary by {self.spread:.0%} between steady steps, more than the gap")
        why = "; ".join(reasons) or "none of the response lengths or the timing spread accounts for it"
        return (f"measured {self.rollout:.2f}x is {gap:.0%} beyond the {self.predicted:.2f}x predicted from "
                f"measured costs: {why}")


    def credit(self) -> list[str]:
        """What the measured speedups owe to something other than drafting, each with its numbers (empty when
        nothing): a whole step faster than generation alone, and answers of a different length."""
        notes = []
        if self.end_to_end > self.rollout * 1.01:  # drafting only changes generation
            plain_u, spec_u = self.update_s
            times = f"the update ran {spec_u:.2f} s against the plain run's {plain_u:.2f} s ({self.update:.2f}x)"
            cause = ("" if not math.isfinite(self.update) else
                     f": {times} on the same number of rows, which drafting does not touch" if self.update > 1.01 else
                     f": not from the update ({times}), so from how the step's parts overlapped (async) or from "
                     "timing noise")
            notes.append(f"end to end {self.end_to_end:.2f}x exceeds generation's {self.rollout:.2f}x, so "
                         f"{'all' if self.rollout <= 1 else 'part'} of the whole step's gain came from outside "
                         f"generation{cause}")
        if abs(self.response_ratio - 1) > 0.03:  # a different length is a different amount of work
            notes.append(f"its answers were {abs(1 - self.response_ratio):.0%} "
                         f"{'shorter' if self.response_ratio < 1 else 'longer'} than the plain run's (median), so "
                         f"part of each ratio is {'less' if self.response_ratio < 1 else 'more'} work, not faster "
                         "decoding")
        return notes


def step_stats(records: Sequence[Mapping]) -> dict[str, float]:
    """A run's timings by `STATISTIC`: seconds per step (`step_s`), of generation (`gen_s`) and of the update
    (`update_s`: policy and head), and generated tokens per second (`tokens_per_s`); NaN where not logged."""
    update = [{"u": u + (value(r, "timing_s/update_mtp") or 0.0)} for r in records
              if (u := value(r, "timing_s/update_actor")) is not None]
    return {"step_s": median(records, "timing_s/step"), "gen_s": median(records, "timing_s/gen"),
            "update_s": median(update, "u") if len(update) == len(records) else math.nan,
            "tokens_per_s": median(records, "perf/throughput")}


def speedup(plain: Sequence[Mapping], spec: Sequence[Mapping]) -> Speedup:
    """The speedup of the MTP run (`spec`'s train records) over the plain run (`plain`'s), both read with
    `STATISTIC` and their counters pooled over the same steady steps."""
    row_steps = total(spec, "engine/num_row_steps") or total(spec, "spec/num_drafts")
    tokens = 1 + total(spec, "spec/num_accepted_tokens") / row_steps if row_steps else math.nan
    cost = step_cost(plain, spec)
    lengths = [median(records, "response_length/mean") for records in (plain, spec)]
    updates = [step_stats(records)["update_s"] for records in (plain, spec)]
    spreads = []
    for records in (plain, spec):
        gen = [v for r in steady(records) if (v := value(r, "timing_s/gen")) is not None]
        spreads.append((max(gen) - min(gen)) / statistics.median(gen) if len(gen) > 1 else 0.0)
    return Speedup(rollout=median(plain, "timing_s/gen") / median(spec, "timing_s/gen"),
                   end_to_end=median(plain, "timing_s/step") / median(spec, "timing_s/step"),
                   tokens_per_row_step=tokens, step_cost=cost,
                   response_ratio=lengths[1] / lengths[0] if lengths[0] else math.nan, spread=max(spreads),
                   update=updates[0] / updates[1] if updates[1] else math.nan, update_s=(updates[0], updates[1]))


def step_cost(plain: Sequence[Mapping], spec: Sequence[Mapping]) -> float:
    """An MTP engine step (its drafts and verify) in the plain run's engine steps; NaN where either run did not log
    the engine's counters."""
    costs = [engine_step_costs({key: total(records, key) for key in ENGINE_COUNTERS}) for records in (plain, spec)]
    if costs[0] is None or costs[1] is None or not costs[0]["verify_s"] > 0:  # not logged: no engine steps counted
        return math.nan
    return (costs[1]["draft_s"] + costs[1]["verify_s"]) / costs[0]["verify_s"]
