"""The cost table's cells (`bebop.engine.depth.DepthController`): each a moving median of one shape's step seconds,
and the least-squares line through a rows bucket's drafting cells that prices the depths not yet settled."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass
class Cell:
    recent: deque  # the last cost_window measurements (seconds)
    count: int = 0  # measurements ever
    last: int = 0  # the controller's observation count when last measured
    seconds: float = math.nan  # its estimate: the median of `recent`, the fastest of one or two (module docstring)

    def add(self, seconds: float) -> None:
        self.recent.append(seconds)
        self.count += 1
        self.seconds = min(self.recent) if len(self.recent) < 3 else statistics.median_low(self.recent)


def fitted_line(cells: Mapping[int, Cell], depths: Sequence[int]) -> list[float]:
    """The costs at `depths` on the weighted least-squares line through {depth: cell} (>= 2 depths; weights: each
    cell's samples in its window), its slope kept >= 0 (a deeper draft never costs less); where the line extrapolated
    below the measured depths reaches 0, the cheapest cell."""
    weights = {g: float(len(cell.recent)) for g, cell in cells.items()}
    total = sum(weights.values())
    mean_g = sum(w * g for g, w in weights.items()) / total
    mean_s = sum(w * cells[g].seconds for g, w in weights.items()) / total
    spread = sum(w * (g - mean_g) ** 2 for g, w in weights.items())
    slope = max(0.0, sum(w * (g - mean_g) * (cells[g].seconds - mean_s) for g, w in weights.items()) / spread)
    floor = min(cell.seconds for cell in cells.values())
    return [cost if cost > 0 else floor for cost in (mean_s + slope * (g - mean_g) for g in depths)]
