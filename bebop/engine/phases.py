"""`PhaseClock`: one engine step split into its phases, each timed, so that they add up to the step.

`Engine(..., phases=PhaseClock())` (or `engine.phases = ...`) makes `generate()` time every decoding step: the loop
opens a step with `begin`, each piece of work closes the interval since the previous mark with `mark(name)`, and
`end` closes the last one. Every instant between `begin` and `end` belongs to exactly one phase, so a step's phases
sum to the step by construction (tests/test_phases.py checks it against the loop's own clock). A name marked twice
in one step adds up. Without a clock the marks are `tick(None, ...)`: one `is None` test each.

On a GPU a mark first waits for the device (`sync`), so that a phase is charged its own kernels, not the next
one's; that wait changes what it measures (no overlap of host and device work), which is why a clock is only
for profiling. Inside a compiled graph nothing can be marked: a compiled engine's phases are its graphs.

The phases (PHASES, in step order; docs/draft-depth.md has the table of what each holds):

  depth          the depth controller's decision before the step and its learning after it
  catch_up       the head's cache caught up after plain steps (a price of switching depth)
  uniforms       the step's random numbers
  draft_forward  the head's forwards over its draft positions (its layer and its LM-head rows)
  draft_sample   q from the head's logits, and the drafts sampled from it
  draft_scatter  q spread from the head's draft vocabulary over the target's
  draft_lookup   prompt lookup's proposals (host work) and their upload
  verify_forward the target's layers over the pending token and the drafts
  verify_lm_head the target's LM head over those positions
  target_probs   the target's distributions (or their log-normalisers) at those positions
  decide         the acceptance tests: how many drafts each row keeps
  next_token     the residual (or the target) at each row's deciding position, and the draw from it
  stats          emitted tokens, their log-probs and entropies, packed into the host table
  host_sync      the one device-to-host copy of the step
  retire         the host's bookkeeping of the rows: what each emitted, stops, finished rows
  compact        finished rows leaving the batch's tensors
  advance        the caches moved past what each row kept, and the head caught up on it
  feed           environment replies fed to the rows that got them
  compiled       (a compiled engine) a whole graph: draft, verify or catch-up
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Callable

PHASES = ("depth", "catch_up", "uniforms", "draft_forward", "draft_sample", "draft_scatter", "draft_lookup",
          "verify_forward", "verify_lm_head", "target_probs", "decide", "next_token", "stats", "host_sync", "retire",
          "compact", "advance", "feed", "compiled")


class PhaseClock:
    """Seconds per phase of each engine step, with the step's own kind (its depths) and rows."""

    def __init__(self, sync: Callable[[], None] | None = None):
        self.sync = sync  # waits for the device before each mark (CUDA); None on a CPU
        self.steps: list[dict] = []  # per step: {"kind", "rows", "tokens", "seconds", "phases": {name: s}}
        self._phases: defaultdict[str, float] = defaultdict(float)
        self._start = self._last = None

    def begin(self) -> None:
        if self.sync is not None:
            self.sync()
        self._phases = defaultdict(float)
        self._start = self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        """Charge the time since the previous mark (or `begin`) to `name`."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}: one of {PHASES}")
        if self.sync is not None:
            self.sync()
        now = time.perf_counter()
        self._phases[name] += now - self._last
        self._last = now

    def end(self, name: str, *, kind: str, rows: int, tokens: int) -> None:
        """Close the step (the time since the last mark is `name`'s): `kind` names its depths (e.g. "plain",
        "γ=3", "rows"), `tokens` what its rows emitted."""
        self.mark(name)
        self.steps.append({"kind": kind, "rows": rows, "tokens": tokens, "seconds": self._last - self._start,
                           "phases": dict(self._phases)})

    def clear(self) -> None:
        self.steps = []


def tick(clock: PhaseClock | None, name: str) -> None:
    """`clock.mark(name)` when profiling; nothing otherwise (and nothing inside a compiled graph, given None)."""
    if clock is not None:
        clock.mark(name)


# What the cost model prices (a target forward over the verified positions, the head's forwards); the rest of a
# step is what it leaves out.
FORWARD_PHASES = ("verify_forward", "verify_lm_head", "draft_forward", "compiled")


def mean_phases(steps: list[dict]) -> dict[str, float]:
    """The mean seconds per step of each phase over `steps` (PhaseClock.steps), 0 where a step did not run it;
    "step" is the mean step itself, "tokens_per_row" the emitted tokens per row-step, "rows" the mean rows."""
    if not steps:
        raise ValueError("no steps to average: the profile recorded none")
    n = len(steps)
    out = {name: sum(s["phases"].get(name, 0.0) for s in steps) / n for name in PHASES}
    out["step"] = sum(s["seconds"] for s in steps) / n
    out["rows"] = sum(s["rows"] for s in steps) / n
    out["tokens_per_row"] = sum(s["tokens"] for s in steps) / sum(s["rows"] for s in steps)
    return out


def row_step_costs(steps: list[dict]) -> dict[str, float]:
    """Seconds per row-step of each phase over `steps` (their sum over the rows they ran), "step" the whole;
    "forwards_full" the forward phases' over the steps that ran every row (the most any step ran), "rows" that count,
    "tokens_per_row" the emitted tokens per row-step."""
    rows = sum(s["rows"] for s in steps)
    out = {name: sum(s["phases"].get(name, 0.0) for s in steps) / rows for name in PHASES}
    out["step"] = sum(s["seconds"] for s in steps) / rows
    out["rows"] = max(s["rows"] for s in steps)
    full = [s for s in steps if s["rows"] == out["rows"]]
    out["forwards_full"] = sum(s["phases"].get(n, 0.0) for s in full for n in FORWARD_PHASES) / sum(
        s["rows"] for s in full)
    out["tokens_per_row"] = sum(s["tokens"] for s in steps) / rows
    return out


def gap_terms(plain: dict[str, float], spec: dict[str, float], *, unit_s: float, modelled_s: float,
              predicted_tokens: float, wall_speedup: float) -> dict[str, float]:
    """Where the measured speedup departs from the cost model's, in log-points (100·ln of a ratio; they add up to
    100·ln(measured / predicted) exactly, and each is about a percentage).

    plain / spec: `row_step_costs` of plain and speculative steps over B rows. The cost model: a plain step costs
    `unit_s` (its one-token target forward), a speculative step `modelled_s` (verification and draft forwards) and
    emits `predicted_tokens` per row; so it predicts predicted_tokens · unit_s / modelled_s. The measurement
    `wall_speedup` is wall time over wall time, prefill included. With c the seconds per row-step (the steps'
    seconds over the rows they ran) the identity behind the terms is

        measured / predicted = (wall / steps) · (tokens_per_row / predicted_tokens)
                               · (c_plain forwards · B / unit_s) · (c_plain / c_plain forwards)
                               / (c_spec forwards of full steps · B / modelled_s) / (c_spec forwards / of full steps)
                               / (c_spec / c_spec forwards)

    with steps = the step loops' own speedup (tokens per second). "the ragged tail" is the forwards' cost per row-step
    over all steps against the steps that ran every row: rows that finish early leave steps of fewer rows, which cost
    more per row. The two "c / c forwards" ratios are split over the phases outside the forwards by their seconds
    ("plain:" terms help drafting: they slow plain decoding; "spec:" terms hurt it)."""
    forwards = {k: sum(d[name] for name in FORWARD_PHASES) for k, d in (("plain", plain), ("spec", spec))}
    steps_speedup = spec["tokens_per_row"] / spec["step"] / (plain["tokens_per_row"] / plain["step"])
    rows = plain["rows"]
    log = lambda x: 100 * math.log(x)  # noqa: E731
    terms = {"prefill, and tokens past the budget": log(wall_speedup / steps_speedup),
             "tokens per row-step": log(spec["tokens_per_row"] / predicted_tokens),
             "plain forward vs the cost unit": log(forwards["plain"] * rows / unit_s),
             "spec forwards vs the cost model": -log(spec["forwards_full"] * rows / modelled_s),
             "the ragged tail (steps of fewer rows)": -log(forwards["spec"] / spec["forwards_full"])}
    for kind, data, sign in (("plain", plain, 1), ("spec", spec, -1)):
        outside = data["step"] - forwards[kind]
        total = log(data["step"] / forwards[kind])
        for name in PHASES:
            if name not in FORWARD_PHASES and data[name] > 0:
                terms[f"{kind}: {name}"] = sign * total * data[name] / outside
    return terms
