"""The cost table's cells: rows buckets, each (bucket, γ) cell a moving median of that shape's step seconds, and the
least-squares line through a bucket's drafting cells that prices the depths not yet settled (docs/draft-depth.md,
Step costs)."""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Cost-table buckets by active rows: exact where a step's cost changes most per row (few rows), then ~1.5x apart.
ROW_BUCKETS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def row_bucket(rows: int) -> int:
    """The cost-table bucket of `rows` active rows: the smallest of ROW_BUCKETS >= rows (or rows itself above)."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    i = bisect.bisect_left(ROW_BUCKETS, rows)
    return ROW_BUCKETS[i] if i < len(ROW_BUCKETS) else rows


@dataclass
class Cell:
    recent: deque  # the last cost_window measurements (seconds)
    count: int = 0  # measurements ever
    last: int = 0  # the controller's observation count when last measured
    seconds: float | None = None  # its estimate once measured: the median of `recent`, the fastest of one or two

    def add(self, seconds: float) -> None:
        self.recent.append(seconds)
        self.count += 1
        self.seconds = min(self.recent) if len(self.recent) < 3 else statistics.median_low(self.recent)


def fitted_line(cells: Mapping[int, Cell], depths: Sequence[int]) -> list[float]:
    """The costs at `depths` on the weighted least-squares line through {depth: measured cell} (>= 2 depths; weights:
    each cell's samples in its window), its slope kept >= 0 (a deeper draft never costs less); where the line
    extrapolated below the measured depths reaches 0, the cheapest cell."""
    weights = {g: float(len(cell.recent)) for g, cell in cells.items()}
    total = sum(weights.values())
    mean_g = sum(w * g for g, w in weights.items()) / total
    mean_s = sum(w * cells[g].seconds for g, w in weights.items()) / total
    spread = sum(w * (g - mean_g) ** 2 for g, w in weights.items())
    slope = max(0.0, sum(w * (g - mean_g) * (cells[g].seconds - mean_s) for g, w in weights.items()) / spread)
    floor = min(cell.seconds for cell in cells.values())
    return [cost if cost > 0 else floor for cost in (mean_s + slope * (g - mean_g) for g in depths)]
