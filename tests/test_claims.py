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
