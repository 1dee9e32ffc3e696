"""`bebop bench losses`: every variant's record from one run, on the same logits, and bad input.

Times and peaks are not asserted (they are the bench's output); what is asserted is that the tiled and hidden
variants computed the plain variant's overlap and gradient (taken to the hidden states), so the bench measures
what it names.
"""

from __future__ import annotations

import json

import pytest

from bebop.cli import main


def test_one_run_writes_every_variant_with_plain_values(tmp_path):
    path = tmp_path / "losses.json"
    assert main(["bench", "losses", "--vocab", "500", "--positions", "40", "--hidden-size", "16", "--repeats", "1",
                 "--tile", "128", "--device", "cpu", "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())["results"]
    for variant in ("plain", "tiled", "hidden"):
        assert row[f"{variant}_s"] > 0 and row[f"{variant}_peak_mib"] >= 0
    assert row["max_abs_grad"] > 1e-3
    for variant in ("tiled", "hidden"):
        assert row[f"max_abs_diff_value_{variant}"] < 1e-5
        assert row[f"max_abs_diff_grad_{variant}"] < 1e-4 * row["max_abs_grad"]


@pytest.mark.parametrize("args, match", [
    (["--positions", "0"], "--positions must be >= 1"),
    (["--hidden-size", "0"], "--hidden-size must be >= 1"),
    (["--vocab", "0"], "--vocab sizes must be >= 1"),
])
def test_bad_arguments_are_one_line_and_exit_2(args, match, capsys):
    assert main(["bench", "losses", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
