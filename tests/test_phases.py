"""bebop.engine.phases: an engine step's phases add up to the step and the steps to the decode loop; the gap's terms add
up to the gap."""

from __future__ import annotations

import math

import pytest
import torch

from bebop.engine import Engine
from bebop.engine.phases import FORWARD_PHASES, PHASES, PhaseClock, gap_terms, mean_phases, row_step_costs
from bebop.engine.rollout import GenerationConfig
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [1, 2, 1, 2]]


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=64, num_hidden_layers=2)
    return Transformer(config).eval(), MTPHead(config).eval()


@pytest.mark.parametrize("gamma", [0, 2, "auto", "rows"])
def test_the_phases_add_up_to_each_step_and_the_steps_to_the_decode_loop(pair, gamma):
    clock = PhaseClock()
    engine = Engine(*pair, phases=clock)
    stats = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=12, gamma=gamma, max_gamma=3, seed=0)).stats
    steps = clock.steps
    assert len(steps) == stats["num_steps"]
    for step in steps:
        assert set(step["phases"]) <= set(PHASES)
        assert sum(step["phases"].values()) == pytest.approx(step["seconds"], rel=1e-9, abs=1e-12)
        assert all(seconds >= 0 for seconds in step["phases"].values())
        assert step["phases"]["verify_forward"] > 0 and step["phases"]["host_sync"] > 0
    loop = stats["wall_time_s"] - stats["engine/prefill_s"]
    covered = sum(step["seconds"] for step in steps)
    assert covered <= loop and loop - covered < 0.05 * loop + 0.005  # what is left: the loop's own test of rows
    assert sum(step["tokens"] for step in steps) >= stats["num_generated_tokens"] - len(PROMPTS)  # (prefill's first)
    if gamma == 2:
        assert all(step["phases"].get("draft_forward", 0) > 0 for step in steps)


def test_an_unknown_phase_is_refused():
    clock = PhaseClock()
    clock.begin()
    with pytest.raises(ValueError, match="unknown phase"):
        clock.mark("lunch")


def _steps(rows: list[int], forward: float, other: float, tokens_per_row: float) -> list[dict]:
    """Steps whose forward costs a fixed 0.02 s plus `forward` per row (a step of fewer rows costs more per row)."""
    return [{"kind": "x", "rows": r, "tokens": round(r * tokens_per_row), "seconds": 0.02 + forward * r + other,
             "phases": {"verify_forward": 0.02 + forward * r, "stats": other}} for r in rows]


def test_the_gap_terms_add_up_to_the_gap():
    plain = _steps([8] * 10, 0.010, 0.004, 1.0)
    spec = _steps([8] * 5 + [3, 1], 0.016, 0.006, 2.0)
    p, s = row_step_costs(plain), row_step_costs(spec)
    assert s["rows"] == 8 and s["forwards_full"] == pytest.approx(0.016 + 0.02 / 8)
    terms = gap_terms(p, s, unit_s=0.07, modelled_s=0.12, predicted_tokens=2.2, wall_speedup=1.3)
    predicted = 2.2 * 0.07 / 0.12
    assert sum(terms.values()) == pytest.approx(100 * math.log(1.3 / predicted))
    assert terms["the ragged tail (steps of fewer rows)"] < 0  # steps of 3 and 1 rows cost more per row
    assert terms["plain: stats"] > 0 and terms["spec: stats"] < 0
    means = mean_phases(spec)
    assert means["step"] == pytest.approx(sum(x["seconds"] for x in spec) / len(spec))
    assert set(FORWARD_PHASES) <= set(PHASES)


def test_the_rows_out_cut_times_the_same_compaction_both_ways(pair):
    """`bench step --cuts`' "rows out": after (in place) leaves the survivors' written slots as before (a new cache)
    makes them."""
    from bebop.commands.bench.cuts import compaction_cells

    cells = compaction_cells(pair[0], batch=5, context=6, max_len=10)
    with torch.inference_mode():  # as time_cuts calls them
        before = cells[("rows out", "before")]()
        after = cells[("rows out", "after")]()
    assert after[0].shape[1] == 4 and torch.equal(after[2], before[2])
    for new, old in zip(after[:2], before[:2]):
        assert torch.equal(new[..., :6, :], old[..., :6, :])


def test_time_cuts_times_each_path_warm_and_swaps_a_pair_s_order_every_round():
    """Each timed batch follows an untimed call of the same cell, and a cut's before / after swap places each round,
    so neither path is timed on the caches the other (or another cut) left."""
    from bebop.commands.bench.cuts import time_cuts

    calls: list[tuple[str, str]] = []
    cells = {(cut, side): (lambda key=(cut, side): calls.append(key)) for cut in ("a", "b") for side in ("before", "after")}
    timed = time_cuts(cells, repeats=2, calls=3)
    assert set(timed) == {"a", "b"} and all(len(row) == 4 for row in timed.values())
    runs = [calls[i:i + 4] for i in range(0, len(calls), 4)]  # one warm call, then the three timed
    assert all(len(set(run)) == 1 for run in runs)
    assert [run[0] for run in runs] == [("a", "before"), ("a", "after"), ("b", "before"), ("b", "after"),
                                        ("a", "after"), ("a", "before"), ("b", "after"), ("b", "before")]
