"""`AcceptanceLaw`: the acceptance of a draft at each position as a line in one feature of its row, fitted live (the
per-row depth's predictor, `bebop.engine.depth.rows`).

For a head's drafts the feature is the row's recent target entropy H: the paper's entropy law, α ≈ a + c·H (PAPER
§3; acceptance falls as the target's entropy rises), here one line per draft position j, each fitted by decayed
weighted least squares on the drafts that reached j (accepted: 1, rejected: 0). For prompt lookup's drafts it is the
match length. A position with little data leans on a prior: one pseudo-draft at the previous position's mean (0.5 at
the first), and a slope shrunk towards 0 by `ridge` pseudo-units of the feature's variance, so a few drafts never tilt
the line far. Predictions are clipped into [FLOOR, 1 - FLOOR]: a row is never written off, nor sure.
"""

from __future__ import annotations

FLOOR = 0.02


class AcceptanceLaw:
    """Decayed sums per draft position j = 0..K-1: weight, Σx, Σy, Σx², Σxy of (feature, accepted) pairs."""

    def __init__(self, max_gamma: int, decay: float, ridge: float = 1.0, prior_weight: float = 1.0):
        self.decay_rate, self.ridge, self.prior_weight = decay, ridge, prior_weight
        self.sums = [[0.0] * 5 for _ in range(max_gamma)]  # per position: w, Σx, Σy, Σx², Σxy
        self._lines: list[tuple[float, float]] | None = None  # `lines`, until the sums change

    def predict(self, x: float) -> list[float]:
        """α̂_j(x) for j = 0..K-1."""
        return [min(1 - FLOOR, max(FLOOR, a + c * x)) for a, c in self.lines()]

    def lines(self) -> list[tuple[float, float]]:
        """Each position's line as (intercept, slope), before clipping: α̂_j(x) = intercept + slope·x. Computed once
        per change of the sums (the controller predicts every row of every step from them)."""
        if self._lines is None:
            self._lines, prior = [], 0.5
            for w, sx, sy, sxx, sxy in self.sums:
                mean_y = (sy + self.prior_weight * prior) / (w + self.prior_weight)
                mean_x, slope = (sx / w if w > 0 else 0.0), 0.0
                if w > 0:
                    var, cov = sxx - w * mean_x * mean_x, sxy - w * mean_x * (sy / w)
                    slope = cov / (var + self.ridge)
                self._lines.append((mean_y - slope * mean_x, slope))
                prior = mean_y
        return self._lines

    def observe(self, x: float, depth: int, accepted: int) -> None:
        """A row with feature x drafted `depth` positions and had the first `accepted` accepted: positions
        0..min(accepted, depth - 1) were reached, the first `accepted` of them accepted."""
        self._lines = None
        for j in range(min(accepted + 1, depth)):
            y = 1.0 if j < accepted else 0.0
            sums = self.sums[j]
            sums[0] += 1.0
            sums[1] += x
            sums[2] += y
            sums[3] += x * x
            sums[4] += x * y

    def decay(self) -> None:
        self._lines = None
        for sums in self.sums:
            for i in range(5):
                sums[i] *= self.decay_rate

    def reached(self) -> list[float]:
        """The decayed weight of the drafts that reached each position (how much each line has learnt from)."""
        return [sums[0] for sums in self.sums]
