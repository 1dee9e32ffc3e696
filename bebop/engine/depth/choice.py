"""What `Engine.generate`'s loop asks before each step and tells after it: a `Choice` of depth, from a `FixedDepth`
(a static γ) or the `DepthController` (gamma="auto"), so both run the same loop.

    choice = depth.decide(rows)                                   # before the step: from earlier steps only
    depth.observe(rows, choice.gamma, seconds, num_accepted, switch_s=...)   # after it
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bebop.engine.depth.cells import row_bucket


@dataclass(frozen=True)
class Choice:
    """One decision and its reasons: the depth, the acceptance it expected and the step cost it used."""

    gamma: int
    rows: int  # active rows
    bucket: int  # their cost-table bucket
    expected_accepted: float | None  # E[accepted | γ] per row (None: a fixed depth expects nothing)
    cost_s: float | None  # estimated seconds of this step (None: the depth had no price yet)
    probe: bool  # chosen to measure, not because it was the best estimate
    # Per live row, in the batch's order (a per-row depth: bebop.engine.depth.rows): each row's own depth (gamma is
    # their deepest) and whether it drafts by prompt lookup instead of the head. None: every row at gamma, by the
    # engine's one draft.
    depths: tuple[int, ...] | None = None
    lookup: tuple[bool, ...] | None = None
    budget: int | None = None  # the verify-token budget the depths were chosen under (None: none)
    plain_s: float | None = None  # the cost model's price of a plain step at these rows (per-row depths)

    def row_depths(self) -> list[int]:
        """Each live row's depth."""
        return list(self.depths) if self.depths is not None else [self.gamma] * self.rows


class Depth(Protocol):
    """What chooses each engine step's draft depth."""

    def decide(self, rows: int) -> Choice: ...

    def observe(self, rows: int, gamma: int, seconds: float, num_accepted: list[int], switch_s: float = 0.0) -> None:
        ...


@dataclass(frozen=True)
class FixedDepth:
    """A static depth γ (0 = plain decoding): every step drafts γ, whatever it observes."""

    gamma: int

    def decide(self, rows: int) -> Choice:
        return Choice(self.gamma, rows, row_bucket(rows), None, None, False)

    def observe(self, rows: int, gamma: int, seconds: float, num_accepted: list[int], switch_s: float = 0.0) -> None:
        pass  # nothing to learn: the depth is fixed
