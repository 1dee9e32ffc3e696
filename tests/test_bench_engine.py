"""`bebop bench engine`: the JSON records it promises, measured on a few tokens of the tiny model.

Speeds are not asserted (they belong to the benchmark's output, not to a test); what is asserted is that every
record the issue names is there with sane values, and that the self-draft head's RS acceptance is ~1 and TO's
is well below it, which would fail if the bench measured a different head or method than it says.
"""

from __future__ import annotations

import json
import math

import pytest

from bebop.bench.engine import MODELS
from bebop.cli import main
from bebop.model import Transformer


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "engine.json"
    code = main(["bench", "engine", "--models", "tiny", "--batch", "1", "2", "--gamma", "2", "--new-tokens", "12",
                 "--prompt-len", "4", "--repeats", "1", "--threads", "1", "--no-compile", "--json", str(path)])
    assert code == 0
    return json.loads(path.read_text())


def test_every_cell_is_there(records):
    cells = {(r["engine"], r["mode"], r["gamma"], r["batch"]) for r in records}
    for batch in (1, 2):
        assert {("bebop", "plain", 0, batch), ("bebop", "to", 2, batch), ("bebop", "rs", 2, batch),
                ("hf", "plain", 0, batch)} <= cells
    assert ("hf", "assisted", 3, 1) in cells  # HF's assisted generation runs at batch 1 only
    for r in records:
        assert r["tokens_per_s"] > 0 and math.isfinite(r["tokens_per_s"]), r


def test_speculative_records_carry_acceptance_speedup_and_theory(records):
    spec = [r for r in records if r["engine"] == "bebop" and r["mode"] in ("to", "rs")]
    assert len(spec) == 4
    for r in spec:
        for key in ("acceptance_rate", "speedup", "theoretical_speedup", "draft_cost", "verify_cost"):
            assert math.isfinite(r[key]) and r[key] > 0, (key, r)
        plain = next(p for p in records if p["engine"] == "bebop" and p["mode"] == "plain" and p["batch"] == r["batch"])
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / plain["tokens_per_s"])
    for r in spec:  # q = p exactly: RS accepts every draft, TO only when p's sample would be argmax q
        if r["mode"] == "rs":
            assert r["acceptance_rate"] > 0.97, r
        else:
            assert r["acceptance_rate"] < 0.8, r


@pytest.mark.slow
def test_compiled_engine_rows_stand_beside_the_eager_ones(tmp_path):
    path = tmp_path / "engine.json"
    assert main(["bench", "engine", "--models", "tiny", "--batch", "2", "--gamma", "2", "--new-tokens", "8",
                 "--prompt-len", "4", "--repeats", "1", "--json", str(path)]) == 0
    records = json.loads(path.read_text())
    bebop = {(r["compiled"], r["mode"]): r for r in records if r["engine"] == "bebop"}
    assert set(bebop) == {(c, m) for c in (False, True) for m in ("plain", "to", "rs")}
    rs = bebop[(True, "rs")]
    assert rs["acceptance_rate"] > 0.97 and math.isfinite(rs["theoretical_speedup"])
    assert rs["speedup"] == pytest.approx(rs["tokens_per_s"] / bebop[(True, "plain")]["tokens_per_s"])
    hf = next(r for r in records if r["engine"] == "hf" and r["mode"] == "plain")
    assert hf["bebop_compiled_plain_over_hf"] == pytest.approx(bebop[(True, "plain")]["tokens_per_s"] / hf["tokens_per_s"])


def test_deep_preset_spreads_the_tiny_parameters_over_more_layers():
    tiny, deep = (Transformer(MODELS[name]()) for name in ("tiny", "deep"))
    assert deep.config.num_hidden_layers >= 4 * tiny.config.num_hidden_layers
    layer_params = lambda m: sum(p.numel() for p in m.model.layers.parameters())  # noqa: E731
    assert 0.75 < layer_params(deep) / layer_params(tiny) < 1.25  # same compute per token, within 25%
