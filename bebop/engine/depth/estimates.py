"""What the depth controller knows of each depth at a rows bucket when it decides, in two named states, and the rule
that picks the best of them (docs/draft-depth.md: Exploration, Margin).

    priced      its tokens/s per row, (1 + E[accepted | γ]) / seconds, from a price of the step's seconds: the
                bucket's own cell or line, another bucket's scaled, or a best case
    to measure  no price here yet (no bucket has measured it, or none that shares a measured depth with this one):
                run before any priced depth, to measure it
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Values:
    priced: dict[int, float]  # γ -> tokens/s per row
    to_measure: frozenset[int]  # the depths without a price (or with one of 0 s, as good as free)

    @classmethod
    def of(cls, costs: Sequence[float | None], expected: Sequence[float]) -> "Values":
        """From each depth's price in seconds (None: none) and E[accepted | γ], both indexed by γ."""
        priced = {g: (1.0 + expected[g]) / s for g, s in enumerate(costs) if s is not None and s > 0}
        return cls(priced, frozenset(g for g in range(len(costs)) if g not in priced))

    @property
    def depths(self) -> list[int]:
        return sorted({*self.priced, *self.to_measure})

    def best(self, margin: float, among: Collection[int] | None = None) -> int:
        """Over `among` (default: every depth): the shallowest depth to measure, if any; else plain decoding while
        within `margin` of the highest tokens/s; else the drafting depth of the highest, the shallowest of a tie."""
        depths = [g for g in self.depths if among is None or g in among]
        to_measure = [g for g in depths if g in self.to_measure]
        if to_measure:
            return to_measure[0]
        top = max(self.priced[g] for g in depths)
        if 0 in depths and self.priced[0] >= (1 - margin) * top:
            return 0
        return max((g for g in depths if g > 0), key=lambda g: self.priced[g])
