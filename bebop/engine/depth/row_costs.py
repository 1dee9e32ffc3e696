"""`RowCosts`: the seconds of an engine step as a function of what it verifies and drafts, per rows bucket, measured
live (the per-row depth's cost model, `bebop.engine.depth.rows`).

A plain step at a bucket is priced by the moving median of its plain steps (a median: on a shared machine one step in
a few takes several times as long). A drafting step whose rows verify N tokens in all (the rows' own, and M drafts),
its deepest row drafting G, is priced by two lines, each through the bucket's own steps:

    t(M, G) = verify(N) + draft(G),     verify(N) = a + b·N,     draft(G) = c + e·G

`draft` is the step's drafting (the head's passes, G per step over every row, and its catch-up on what the rows kept;
or prompt lookup's proposals), which the engine times apart (`observe(draft_s=)`); `verify` the rest (the
verification forward, its LM head and statistics over the N positions, the residual, the host's bookkeeping). Apart,
each line is fitted on one quantity that varies from step to step; together a budget M and a depth G rise and fall
together and a line in both could not tell them apart. Plain steps are points of `verify` too (N = rows, no draft):
they anchor it, so a few drafting steps beside them fix its slope. Until a line has data it leans on a prior relative
to the plain step (`PRIOR`: a verified token a quarter of a plain row-step, a draft position a tenth of a plain step;
measured on a CPU: SmolLM2 at 32 rows about 0.13 and 0.05, the tiny policy at 8 rows 0.11 and 0.33), by
`prior_weight` pseudo-steps half the rows (one depth) away: the slopes are shrunk towards it, the intercepts follow
the data's means. A step slower than twice its price enters at twice its
price (one slow patch must not move a line far). A bucket's first steps measure plain decoding (two), then one
drafting step, before a draft is priced (`to_measure`).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

PRIOR = (0.25, 0.1)  # a verified token's cost in plain row-steps; a draft position's in plain steps


class Line:
    """y ≈ intercept + slope·x by decayed least squares, the slope shrunk towards a prior by `weight` pseudo-points
    of the prior's spread `scale` (the feature's typical size)."""

    def __init__(self):
        self.sums = [0.0] * 5  # w, Σx, Σy, Σx², Σxy

    def add(self, x: float, y: float, decay: float) -> None:
        self.sums = [s * decay for s in self.sums]
        for i, v in enumerate((1.0, x, y, x * x, x * y)):
            self.sums[i] += v

    def fitted(self, prior: tuple[float, float], weight: float, scale: float) -> tuple[float, float]:
        """The line as (intercept, slope); `prior`'s (intercept, slope) where it has no data."""
        w, sx, sy, sxx, sxy = self.sums
        if w <= 0:
            return prior
        mean_x, mean_y = sx / w, sy / w
        var, cov = sxx - w * mean_x * mean_x, sxy - w * mean_x * mean_y
        lam = weight * scale * scale
        slope = max(0.0, (cov + lam * prior[1]) / (var + lam))
        return mean_y - slope * mean_x, slope


@dataclass
class BucketCosts:
    plain: deque = field(default_factory=lambda: deque(maxlen=9))  # recent plain steps' seconds
    verify: Line = field(default_factory=Line)  # seconds outside drafting against verified tokens N
    draft: Line = field(default_factory=Line)  # drafting seconds against the deepest row's depth G
    drafted: int = 0  # drafting steps measured


class RowCosts:
    def __init__(self, decay: float, prior_weight: float = 1.0):
        self.decay, self.prior_weight = decay, prior_weight
        self.buckets: dict[int, BucketCosts] = {}

    def to_measure(self, bucket: int) -> str | None:
        """"plain" or "draft" while the bucket has not measured that side yet (2 plain steps, 1 drafting), else None."""
        cell = self.buckets.get(bucket)
        if cell is None or len(cell.plain) < 2:
            return "plain"
        return "draft" if cell.drafted == 0 else None

    def price(self, bucket: int, rows: int, drafts: int, deepest: int) -> float | None:
        """Seconds of a step at `bucket` verifying `drafts` drafts beside its `rows` tokens, its deepest row at
        `deepest` (drafts = 0: plain decoding); None where the bucket has not measured plain decoding yet."""
        pricer = self.pricer(bucket, rows)
        return None if pricer is None else pricer(drafts, deepest)

    def pricer(self, bucket: int, rows: int):
        """`price` at this bucket and rows as a function of (drafts, deepest); None where the bucket has not measured
        plain decoding yet. A draft never costs less than plain decoding."""
        cell = self.buckets.get(bucket)
        if cell is None or not cell.plain:
            return None
        plain = statistics.median(cell.plain)
        per_token, per_position = PRIOR[0] * plain / rows, PRIOR[1] * plain
        v0, v1 = cell.verify.fitted((plain - per_token * rows, per_token), self.prior_weight, rows / 2)
        d0, d1 = cell.draft.fitted((0.0, per_position), self.prior_weight, 1.0)

        def price(drafts: int, deepest: int) -> float:
            if drafts == 0:
                return plain
            return max(plain, v0 + v1 * (rows + drafts) + max(d0 + d1 * deepest, 0.0))
        return price

    def observe(self, bucket: int, rows: int, budget: int, deepest: int, seconds: float, draft_s: float) -> None:
        """A step at `bucket` verified `budget` tokens (its rows' and their drafts), its deepest row `deepest` drafts,
        in `seconds` (less any catch-up of the head after plain steps), `draft_s` of them drafting."""
        cell = self.buckets.setdefault(bucket, BucketCosts())
        drafts = budget - rows
        if drafts == 0:
            cell.plain.append(seconds)
            cell.verify.add(float(rows), seconds, self.decay)
            return
        if cell.plain:
            seconds = min(seconds, 2 * self.price(bucket, rows, drafts, deepest))
            draft_s = min(draft_s, seconds)
        cell.verify.add(float(budget), seconds - draft_s, self.decay)
        cell.draft.add(float(deepest), draft_s, self.decay)
        cell.drafted += 1


class ProbeClock:
    """When a bucket may run the side its estimates did not choose (plain decoding, or its best draft), to keep that
    side's price and acceptance fresh: once the probe's expected loss is at most `budget` of the seconds the bucket
    has run since its last probe (less what the head's catch-ups after plain steps cost, which the probes pay)."""

    def __init__(self, budget: float):
        self.budget, self.since = budget, {}

    def due(self, bucket: int, loss: float) -> bool:
        if self.budget <= 0 or self.since.get(bucket, 0.0) * self.budget < loss:
            return False
        self.since[bucket] = 0.0
        return True

    def spent(self, bucket: int, seconds: float, switch_s: float = 0.0) -> None:
        """A step of `seconds` ran at `bucket`; `switch_s` of them caught the head up after plain steps, a price of
        switching that the probes pay: it pushes the next one back by what the budget needs to cover it."""
        self.since[bucket] = self.since.get(bucket, 0.0) + seconds - (switch_s / self.budget if self.budget else 0.0)
