"""A notebook's headline claims: asserted where the run is a regression test, reported where it is a measurement.

The notebooks' `quick` and `full` profiles run the embedded tiny policy, whose findings are known: there a claim
that fails is a regression in bebop, so `check` raises. The `real` profile runs a pretrained model (SmolLM2) to
replicate the paper's findings on it: there a claim that does not hold is the result, so `check` records it and
the notebook goes on to print what it measured. Invariants that hold by algebra (bounds, losslessness, gradients
equal to their closed forms) are not claims: notebooks assert them under every profile.

A claim about the entropy law goes through `law`, which reads the fit the one way every page does
(`bebop.entropy_law.EntropyFit`): its numbers are the fit's `reading()` (slope, interval, R², points and what the
points cannot support), and a fit whose line rests on the layout of its points (separated clusters, one point that sets
it) holds only if the fit its flag points to holds too. No claim is kept because the line through two clusters reads
well.

Some of the paper's findings do not show on the tiny policy (too small a vocabulary, heads adapted from one base).
Those are `expect`ed: recorded and never raised under any profile, each with the reason it may fail, so the
notebook's reading, written by `markdown()` from what was recorded, says which held and why the others did not,
instead of prose that promises what the numbers beside it contradict.

    claims = Claims(strict=profile != "real")
    claims.check("TO slope < 0, head ce", slope < 0 and ci_high < 0, f"{slope:+.3f} [.., {ci_high:+.3f}]")
    claims.expect("RS + CE falls like TO", ratio > 0.5, f"RS / TO slope {ratio:.2f}", why_not="...")
    claims.law("TO falls with entropy", fit, lambda f: f.slope_ci[1] < 0)  # an EntropyFit: its reading, its flags
    claims.summary()  # one line per claim: holds / does not hold, with what was measured
    display(Markdown(claims.markdown()))  # the same as a reading: what held, what did not and why
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Claim:
    text: str
    holds: bool
    measured: str  # the numbers that decided it
    asserted: bool  # checked (raises when strict) rather than expected (reported only)
    why_not: str = ""  # the reason it may fail, said when it does


@dataclass
class Claims:
    strict: bool  # True: a `check`ed claim that does not hold raises AssertionError
    claims: list[Claim] = field(default_factory=list)

    def check(self, claim: str, holds: bool, measured: str, *, why_not: str = "") -> bool:
        """Record whether `claim` holds (`measured`: the numbers that decided it); raise when strict and it fails."""
        self.claims.append(Claim(claim, bool(holds), measured, asserted=True, why_not=why_not))
        assert holds or not self.strict, f"{claim}: does not hold ({measured})"
        return bool(holds)

    def expect(self, claim: str, holds: bool, measured: str, *, why_not: str) -> bool:
        """Record one of the paper's expectations, never raised: `why_not` says why this run may not show it."""
        self.claims.append(Claim(claim, bool(holds), measured, asserted=False, why_not=why_not))
        return bool(holds)

    def law(self, claim: str, fit, holds, *, expect: bool = False, why_not: str = "", unit: str = "per nat") -> bool:
        """Record a claim about the entropy law decided by `holds(fit)` on `fit` (a `bebop.entropy_law.EntropyFit`)
        and, where the fit rests on the layout of its points, on the fit its flag points to (`EntropyFit.supports`);
        measured: the fit's reading. `expect`: one of the paper's expectations, never raised (`why_not` required)."""
        ok, measured = fit.supports(holds), fit.reading(unit)
        if fit.layout and bool(holds(fit)) and not ok:
            why_not = (f"{why_not} " if why_not else "") + "The line holds across the clusters (or through one point) " \
                "but not within them."
        if expect:
            return self.expect(claim, ok, measured, why_not=why_not)
        return self.check(claim, ok, measured, why_not=why_not)

    @property
    def results(self) -> list[tuple[str, bool, str]]:
        """(claim, holds, measured) in the order recorded."""
        return [(c.text, c.holds, c.measured) for c in self.claims]

    @property
    def failed(self) -> list[str]:
        return [c.text for c in self.claims if not c.holds]

    def summary(self) -> str:
        """One line per claim, in the order recorded."""
        return "\n".join(f"{'holds' if c.holds else 'DOES NOT HOLD':>13}: {c.text} ({c.measured})"
                         + ("" if c.asserted else " [expected, not asserted]") for c in self.claims)

    def markdown(self) -> str:
        """The claims as a reading: what held, then what did not, each with its numbers and, if it failed, why."""
        held = [c for c in self.claims if c.holds]
        missed = [c for c in self.claims if not c.holds]
        lines = [f"**What this run found** ({len(held)} of {len(self.claims)} claims hold)."]
        if held:
            lines += ["", "Holds:", ""] + [f"- {c.text} ({c.measured})." for c in held]
        if missed:
            lines += ["", "Does not hold here:", ""]
            lines += [f"- {c.text}: **no** ({c.measured}). {c.why_not}".rstrip() for c in missed]
        return "\n".join(lines)
