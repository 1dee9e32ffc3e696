"""A notebook's headline claims: asserted where the run is a regression test, reported where it is a measurement.

The notebooks' `quick` and `full` profiles run the embedded tiny policy, whose findings are known: there a claim
that fails is a regression in bebop, so `check` raises. The `real` profile runs a pretrained model (SmolLM2) to
replicate the paper's findings on it: there a claim that does not hold is the result, so `check` records it and
the notebook goes on to print what it measured. Invariants that hold by algebra (bounds, losslessness, gradients
equal to their closed forms) are not claims: notebooks assert them under every profile.

    claims = Claims(strict=profile != "real")
    claims.check("TO slope < 0, head ce", slope < 0 and ci_high < 0, f"{slope:+.3f} [.., {ci_high:+.3f}]")
    claims.summary()  # one line per claim: holds / does not hold, with what was measured
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Claims:
    strict: bool  # True: a claim that does not hold raises AssertionError
    results: list[tuple[str, bool, str]] = field(default_factory=list)  # (claim, holds, measured)

    def check(self, claim: str, holds: bool, measured: str) -> bool:
        """Record whether `claim` holds (`measured`: the numbers that decided it); raise when strict and it fails."""
        self.results.append((claim, bool(holds), measured))
        assert holds or not self.strict, f"{claim}: does not hold ({measured})"
        return bool(holds)

    @property
    def failed(self) -> list[str]:
        return [claim for claim, holds, _ in self.results if not holds]

    def summary(self) -> str:
        """One line per claim, in the order checked."""
        return "\n".join(f"{'holds' if holds else 'DOES NOT HOLD':>13}: {claim} ({measured})"
                         for claim, holds, measured in self.results)
