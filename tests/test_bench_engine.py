"""`bebop bench engine`: the JSON records it promises, measured on a few tokens of the tiny model.

Speeds are not asserted (they belong to the benchmark's output, not to a test); what is asserted is that every
record the issue names is there with sane values, and that the self-draft head's RS acceptance is ~1 and TO's
is well below it, which would fail if the bench measured a different head or method than it says (with a
false-failure rate of about 1e-4, measured: see the test).
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile

import pytest
import torch

from bebop.cli import main
from bebop.commands.bench.costs import step_costs
from bebop.commands.bench.engine import MODELS
from bebop.models.transformer import Transformer


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "engine.json"
    code = main(["bench", "engine", "--models", "tiny", "--batch", "1", "2", "--gamma", "2", "--new-tokens", "12",
                 "--prompt-len", "4", "--repeats", "3", "--threads", "1", "--no-compile", "--json", str(path)])
    assert code == 0
    return json.loads(path.read_text())


def per_round_median(slow: dict, fast: dict) -> float:
    """What the bench promises for a ratio: the median over rounds of slow / fast seconds within a round."""
    assert len(slow["round_seconds"]) == len(fast["round_seconds"]) == 3
    return statistics.median(a / b for a, b in zip(slow["round_seconds"], fast["round_seconds"]))


def test_every_cell_is_there(records):
    cells = {(r["engine"], r["mode"], r["gamma"], r["batch"]) for r in records}
    for batch in (1, 2):
        assert {("bebop", "plain", 0, batch), ("bebop", "to", 2, batch), ("bebop", "rs", 2, batch),
                ("hf", "plain", 0, batch)} <= cells
    assert ("hf", "assisted", 3, 1) in cells  # HF's assisted generation runs at batch 1 only
    for r in records:
        assert r["tokens_per_s"] > 0 and math.isfinite(r["tokens_per_s"]), r


def test_bebop_over_hf_is_the_median_of_per_round_ratios(records):
    for batch in (1, 2):
        hf, plain = (next(r for r in records if r["engine"] == engine and r["mode"] == "plain" and r["batch"] == batch)
                     for engine in ("hf", "bebop"))
        assert hf["bebop_plain_over_hf"] == pytest.approx(per_round_median(hf, plain))


def test_step_costs_are_per_round_ratios_so_drift_cancels():
    # The machine slows down round by round, and one round of target_1 hits a slow patch of its own. The costs
    # are per-round ratios, so neither moves them; a ratio of medians would give verify_cost 1.125, not 1.5.
    drift = [1.0, 2.0, 3.0, 4.0, 5.0]
    rounds = {"target_1": [2e-3 * f for f in drift], "target_verify": [3e-3 * f for f in drift],
              "catch_up": [1.5e-3 * f for f in drift], "single": [1e-3 * f for f in drift]}
    rounds["target_1"][0] *= 10
    costs = step_costs(rounds, gamma=3)
    assert costs["verify_cost"] == pytest.approx(1.5)
    assert costs["draft_cost"] == pytest.approx((1.5 + 2 * 1.0) / 3 / 2)


def test_speculative_records_carry_acceptance_speedup_and_theory(records):
    spec = [r for r in records if r["engine"] == "bebop" and r["mode"] in ("to", "rs")]
    assert len(spec) == 4
    for r in spec:
        for key in ("acceptance_rate", "speedup", "theoretical_speedup", "draft_cost", "verify_cost"):
            assert math.isfinite(r[key]) and r[key] > 0, (key, r)
        plain = next(p for p in records if p["engine"] == "bebop" and p["mode"] == "plain" and p["batch"] == r["batch"])
        assert r["speedup"] == pytest.approx(per_round_median(plain, r))
    # q = p exactly: RS accepts every draft (up to rounding), TO only when p's sample is argmax q, max p on average
    # (0.25 here). One row's TO acceptance is heavy-tailed, not a mean with a standard error: a row can wander into
    # tokens whose max p is up to 0.97. Over 1500 draws of prompts and seed, a record reads >= 0.8 in 3.3% of them at
    # batch 1 and 0.2% at batch 2, both records in ~1e-4; RS read exactly 1.0 in all 300 tried. So TO is asserted
    # on the lower of its two records (measured 0.22; 0.6 at batch 1): a bench that ran RS under TO's name fails.
    assert all(r["acceptance_rate"] > 0.97 for r in spec if r["mode"] == "rs"), spec
    assert min(r["acceptance_rate"] for r in spec if r["mode"] == "to") < 0.8, spec


def test_compiled_engine_rows_stand_beside_the_eager_ones(tmp_path, monkeypatch):
    """The records of the compiled cells, not the compiled graphs: that the compiled engine computes what the eager
    one does is tests/test_engine.py's, and tracing the phases again here would add minutes (dynamo's symbolic
    shapes alone took 2.5 of them). So torch.compile hands the functions back as they are."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    path = tmp_path / "engine.json"
    assert main(["bench", "engine", "--models", "tiny", "--batch", "1", "2", "--gamma", "2", "--new-tokens", "8",
                 "--prompt-len", "4", "--repeats", "1", "--compile-batch", "2", "--json", str(path)]) == 0
    records = json.loads(path.read_text())
    assert not any(r["compiled"] for r in records if r["batch"] == 1)  # compiled only where --compile-batch says
    bebop = {(r["compiled"], r["mode"]): r for r in records if r["engine"] == "bebop" and r["batch"] == 2}
    assert set(bebop) == {(c, m) for c in (False, True) for m in ("plain", "to", "rs")}
    rs = bebop[(True, "rs")]
    assert rs["acceptance_rate"] > 0.97 and math.isfinite(rs["theoretical_speedup"])
    assert rs["speedup"] == pytest.approx(rs["tokens_per_s"] / bebop[(True, "plain")]["tokens_per_s"])  # one round
    hf = next(r for r in records if r["engine"] == "hf" and r["mode"] == "plain" and r["batch"] == 2)
    assert hf["bebop_compiled_plain_over_hf"] == pytest.approx(bebop[(True, "plain")]["tokens_per_s"] / hf["tokens_per_s"])


def test_deep_preset_spreads_the_tiny_parameters_over_more_layers():
    tiny, deep = (Transformer(MODELS[name]()) for name in ("tiny", "deep"))
    assert deep.config.num_hidden_layers >= 4 * tiny.config.num_hidden_layers
    layer_params = lambda m: sum(p.numel() for p in m.model.layers.parameters())  # noqa: E731
    assert 0.75 < layer_params(deep) / layer_params(tiny) < 1.25  # same compute per token, within 25%


def test_task_prompts_a_draft_vocabulary_and_prompt_lookup(tmp_path):
    """--task draws the policy's prompts from a task; a head over a draft vocabulary also gets its draft position
    timed over the whole vocabulary; prompt lookup (no head) gets rows without step costs."""
    from bebop.default import DEFAULT_DIR, load_default
    from bebop.models.checkpoint import save_head

    head = load_default(dtype=torch.float32).heads["e2e_tv"]
    save_head(head.use_draft_vocab(torch.arange(60)), tmp_path / "on_s")
    rows = {}
    for spec in (str(tmp_path / "on_s"), "lookup"):
        path = tmp_path / f"{spec[-4:]}.json"
        assert main(["bench", "engine", "--policy", str(DEFAULT_DIR), "--head", spec, "--task", "math", "--batch",
                     "2", "--gamma", "2", "--new-tokens", "6", "--repeats", "1", "--threads", "1", "--no-compile",
                     "--no-hf", "--json", str(path)]) == 0
        rows[spec] = [r for r in json.loads(path.read_text()) if r["mode"] == "rs"]
    on_s, lookup = rows[str(tmp_path / "on_s")], rows["lookup"]
    assert all(r["prompts"] == "math" for r in on_s + lookup)
    assert on_s and all(0 < r["draft_cost"] and 0 < r["draft_cost_full_vocab"] for r in on_s)
    assert lookup and all("draft_cost" not in r and r["theoretical_speedup"] is None and r["speedup"] > 0
                          for r in lookup)


def test_temperature_reaches_every_engine(tmp_path, monkeypatch):
    """--temperature is the sampling temperature of bebop's engine and of HF generate() alike, and is recorded."""
    from bebop.commands.bench import hf_peer
    from bebop.engine import Engine

    seen = []
    generate, hf_generate = Engine.generate, hf_peer.hf_generate
    monkeypatch.setattr(Engine, "generate", lambda self, prompts, config, *a, **k: seen.append(
        ("bebop", config.temperature)) or generate(self, prompts, config, *a, **k))
    monkeypatch.setattr(hf_peer, "hf_generate", lambda target, prompts, mask, new_tokens, temperature, *a:
                        seen.append(("hf", temperature)) or hf_generate(target, prompts, mask, new_tokens,
                                                                        temperature, *a))
    path = tmp_path / "engine.json"
    assert main(["bench", "engine", "--models", "tiny", "--batch", "1", "--gamma", "1", "--new-tokens", "4",
                 "--prompt-len", "4", "--repeats", "1", "--threads", "1", "--no-compile", "--temperature", "0.5",
                 "--json", str(path)]) == 0
    assert {engine for engine, _ in seen} == {"bebop", "hf"} and {t for _, t in seen} == {0.5}
    assert {r["temperature"] for r in json.loads(path.read_text()) if "temperature" in r} == {0.5}
    assert main(["bench", "engine", "--temperature", "0"]) == 2


def test_the_files_the_peers_load_from_are_gone_when_the_bench_ends(tmp_path, monkeypatch):
    """The peers load the model from files the bench saves (SmolLM2: 635 MB a run); left behind, a day of benches
    and test runs filled the disk of the machine CI runs on."""
    from bebop.commands.bench import engine as bench

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    saved = []
    hf_models = bench.hf_models
    monkeypatch.setattr(bench, "hf_models", lambda model, dtype, device, workdir: saved.append(workdir) or
                        hf_models(model, dtype, device, workdir))
    assert main(["bench", "engine", "--models", "tiny", "--batch", "1", "--gamma", "1", "--new-tokens", "4",
                 "--prompt-len", "4", "--repeats", "1", "--threads", "1", "--no-compile", "--no-costs",
                 "--json", str(tmp_path / "engine.json")]) == 0
    assert saved and saved[0].parent == tmp_path  # the peers were given a folder, where tempfile makes them
    assert not saved[0].exists() and not list(tmp_path.glob("bebop-bench-*"))


def test_prompt_sets_decode_disjoint_sets_in_every_cell_and_count_all_their_tokens(tmp_path, monkeypatch):
    """--prompt-sets 3 at --batch 2: every bebop cell's call decodes three disjoint pairs of the task's held-out
    prompts, the first six, and tokens/s counts the tokens of all three."""
    from bebop.data.prompts import prompt_format, prompt_ids
    from bebop.data.tasks import get as get_task
    from bebop.default import DEFAULT_DIR, load_default
    from bebop.engine import Engine

    seen = []
    generate = Engine.generate
    monkeypatch.setattr(Engine, "generate", lambda self, prompts, config, *a, **k: seen.append(
        (config.gamma, prompts)) or generate(self, prompts, config, *a, **k))
    path = tmp_path / "engine.json"
    assert main(["bench", "engine", "--policy", str(DEFAULT_DIR), "--task", "math", "--batch", "2", "--gamma", "2",
                 "rows", "--methods", "rs", "--prompt-sets", "3", "--new-tokens", "5", "--repeats", "1",
                 "--threads", "1", "--no-compile", "--no-hf", "--no-costs", "--json", str(path)]) == 0
    tokenizer = load_default(dtype=torch.float32).tokenizer
    six = prompt_ids(tokenizer, get_task("math").sample(6, seed=3_000_017), prompt_format("auto", tokenizer))
    for gamma in (0, 2, "rows"):
        calls = [prompts for g, prompts in seen if g == gamma]
        assert len(calls) == 2 * 3  # warm-up and one round, three sets each
        assert calls[:3] == calls[3:] == [six[0:2], six[2:4], six[4:6]]
    for r in json.loads(path.read_text()):
        assert r["prompt_sets"] == 3
        assert r["tokens_per_s"] == pytest.approx(2 * 5 * 3 / r["round_seconds"][0])
    assert main(["bench", "engine", "--prompt-sets", "0"]) == 2


def test_pooled_stats_sum_the_counters_and_derive_the_rates_again():
    """Two calls pooled as one: counters summed (a depth only one call chose included), rates from the sums, not
    the last call's."""
    from bebop.commands.bench.prompt_sets import pooled_stats
    from bebop.engine import Engine
    from bebop.engine.rollout import GenerationConfig
    from bebop.models.config import ModelConfig
    from bebop.models.mtp import MTPHead

    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=64, num_hidden_layers=2)
    engine = Engine(Transformer(config).eval(), MTPHead(config).eval())
    calls = [engine.generate(prompts, GenerationConfig(max_new_tokens=9, gamma="rows", max_gamma=3, seed=seed)).stats
             for seed, prompts in ((0, [[1, 2, 3], [4, 5]]), (1, [[6], [7, 8, 9], [10, 11]]))]
    pooled = pooled_stats(calls)
    total = lambda key: sum(c.get(key, 0) for c in calls)  # noqa: E731
    for key in ("num_prompts", "num_generated_tokens", "wall_time_s", "engine/prefill_s", "engine/num_row_steps",
                "spec/num_drafts", "spec/num_accepted_tokens", "spec/num_row_depth/0"):
        assert pooled[key] == pytest.approx(total(key)), key
    binned = [key for key in pooled if key.startswith("spec/by_entropy/") and key.endswith("/num_draft_tokens")]
    assert binned and all(pooled[key] == total(key) for key in binned)  # the entropy law's counters too
    assert pooled["num_prompts"] == 5
    assert pooled["spec/acceptance_rate"] == pytest.approx(
        total("spec/num_accepted_tokens") / total("spec/num_draft_tokens"))
    assert pooled["tokens_per_s"] == pytest.approx(total("num_generated_tokens") / total("wall_time_s"))
    assert pooled_stats(calls[:1]) == calls[0]


def test_stop_ends_rows_at_the_tasks_stops_and_times_each_round_per_generated_token(tmp_path, monkeypatch):
    """--stop: every bebop cell decodes with the task's stops (as a rollout does), and a cell's round seconds are
    scaled to the fixed token count by the tokens that round generated (HF generate()'s cells too); without --task
    it is refused in one line."""
    from bebop.commands.bench.hf_peer import HFCell
    from bebop.commands.bench.prompt_sets import SetsCell, per_generated_token
    from bebop.default import DEFAULT_DIR
    from bebop.engine import Engine

    stops = []
    generate = Engine.generate
    monkeypatch.setattr(Engine, "generate", lambda self, prompts, config, *a, **k: stops.append(
        config.stop_tokens) or generate(self, prompts, config, *a, **k))
    path = tmp_path / "engine.json"
    assert main(["bench", "engine", "--policy", str(DEFAULT_DIR), "--task", "math", "--stop", "--batch", "2",
                 "--gamma", "2", "--methods", "rs", "--new-tokens", "6", "--repeats", "1", "--threads", "1",
                 "--no-compile", "--no-hf", "--no-costs", "--json", str(path)]) == 0
    assert stops and all(stops)  # every call had the task's stop tokens
    cell, hf = SetsCell(None, [], None), HFCell(None, [], None, 8, 1.0)
    cell.tokens, hf.tokens = [9, 4, 12], [5, 2]  # warm-up, then the rounds
    timed = per_generated_token({"a": ([2.0, 3.0], "r"), "b": ([1.0], "s"), "h": ([3.0], "t")},
                                {"a": cell, "b": lambda: None, "h": hf}, 8)
    assert timed == {"a": ([4.0, 2.0], "r"), "b": ([1.0], "s"), "h": ([12.0], "t")}
    assert main(["bench", "engine", "--stop", "--no-hf"]) == 2
    # HF generate() ends rows at token ids only: a task with a multi-token stop string needs --no-hf
    assert main(["bench", "engine", "--policy", str(DEFAULT_DIR), "--task", "agent", "--stop"]) == 2


def test_stop_ends_hf_generates_rows_at_the_tasks_stops_too(tmp_path, monkeypatch):
    """--stop beside HF generate(): it is handed the task's stop ids, and its tokens are counted through each row's
    first stop, so its rounds too are timed per generated token."""
    from bebop.commands.bench import hf_peer
    from bebop.default import DEFAULT_DIR

    seen, generate = [], hf_peer.hf_generate
    monkeypatch.setattr(hf_peer, "hf_generate", lambda *a, **k: seen.append(a[6]) or generate(*a, **k))
    path = tmp_path / "engine.json"
    assert main(["bench", "engine", "--policy", str(DEFAULT_DIR), "--task", "math", "--stop", "--batch", "1",
                 "--gamma", "1", "--methods", "rs", "--new-tokens", "6", "--repeats", "1", "--threads", "1",
                 "--no-compile", "--no-costs", "--json", str(path)]) == 0
    assert seen and all(stops for stops in seen)  # plain and assisted, warm-up and round, all with the stops
    records = json.loads(path.read_text())
    assert {(r["engine"], r["mode"]) for r in records if r["engine"] == "hf"} == {("hf", "plain"), ("hf", "assisted")}


def test_hf_tokens_are_counted_through_each_rows_first_stop():
    from bebop.commands.bench.hf_peer import generated_tokens

    sequences = torch.tensor([[9, 9, 1, 2, 7, 7], [9, 9, 7, 3, 4, 5], [9, 9, 1, 2, 3, 4]])  # 2 prompt tokens each
    assert generated_tokens(sequences, 2, (7,)) == 3 + 1 + 4  # the stop counted; past it HF pads
    assert generated_tokens(sequences, 2, (7, 3)) == 3 + 1 + 3
    assert generated_tokens(sequences, 2) == 12  # no stops: every new token
