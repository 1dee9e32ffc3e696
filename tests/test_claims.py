"""bebop.claims: a notebook's headline claims raise under the tiny policy's profiles and are reported under `real`."""

import pytest

from bebop.claims import Claims


def test_strict_claims_raise_with_what_was_measured():
    claims = Claims(strict=True)
    assert claims.check("TO slope < 0", True, "-0.4")
    with pytest.raises(AssertionError, match=r"RS flatter than TO: does not hold \(RS -0.5, TO -0.4\)"):
        claims.check("RS flatter than TO", False, "RS -0.5, TO -0.4")


def test_reported_claims_go_on_and_say_which_failed():
    claims = Claims(strict=False)
    assert not claims.check("accept length >= 1.5", False, "1.21")
    assert claims.check("TO slope < 0", True, "-0.02")
    assert claims.failed == ["accept length >= 1.5"]
    lines = claims.summary().splitlines()
    assert lines[0].endswith("DOES NOT HOLD: accept length >= 1.5 (1.21)")
    assert lines[1].endswith("holds: TO slope < 0 (-0.02)")


def test_expectations_are_reported_under_every_profile_and_the_reading_says_why():
    claims = Claims(strict=True)
    claims.check("TO slope < 0", True, "-0.4")
    assert not claims.expect("RS + CE falls like TO", False, "RS / TO slope 0.2", why_not="The heads share a base.")
    assert claims.failed == ["RS + CE falls like TO"]
    assert claims.summary().splitlines()[1].endswith("(RS / TO slope 0.2) [expected, not asserted]")
    reading = claims.markdown()
    assert reading.startswith("**What this run found** (1 of 2 claims hold).")
    assert "- TO slope < 0 (-0.4)." in reading
    assert "- RS + CE falls like TO: **no** (RS / TO slope 0.2). The heads share a base." in reading
    assert reading.index("Holds:") < reading.index("Does not hold here:")


def test_a_reading_with_every_claim_held_has_no_failure_section():
    claims = Claims(strict=False)
    claims.check("accept length >= 1.5", True, "2.9")
    assert "Does not hold" not in claims.markdown()


def test_a_law_claim_reads_the_fit_and_does_not_hold_across_clusters_alone():
    """A line that falls only because two clusters sit apart (flat within the main one) does not hold as "acceptance
    falls with entropy"; the claim's numbers are the fit's reading, flags and within slope included."""
    import torch

    from bebop.entropy_law import fit_entropy_law

    g = torch.Generator().manual_seed(0)
    near = 0.5 * torch.rand(40, generator=g, dtype=torch.float64)
    far = 1.5 + 0.5 * torch.rand(6, generator=g, dtype=torch.float64)
    h = torch.cat([near, far])
    y = torch.cat([3.0 + 0.1 * torch.randn(40, generator=g, dtype=torch.float64), torch.full((6,), 1.5)])
    fit = fit_entropy_law(h, y)
    falls = lambda f: f.slope_ci[1] < 0  # noqa: E731
    assert falls(fit) and fit.layout and not falls(fit.within)
    claims = Claims(strict=False)
    assert not claims.law("acceptance falls with entropy", fit, falls)
    (claim,) = claims.claims
    assert claim.measured == fit.reading() and "separated clusters" in claim.measured
    assert "not within them" in claim.why_not
    steady = fit_entropy_law(near, 3.0 - 1.0 * near + 0.05 * torch.randn(40, generator=g, dtype=torch.float64))
    assert not steady.flagged and Claims(strict=True).law("falls", steady, falls)  # an unflagged fit decides alone
    with pytest.raises(AssertionError, match="does not hold"):
        Claims(strict=True).law("acceptance falls with entropy", fit, falls)
