"""`bebop eval-mtp`: records agree with the engine's counters, d_TV alignment, tables, fits, bad input;
what the shipped heads must show is in tests/test_shipped_heads.py and tests/test_shipped_ranking.py."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

import bebop.commands.eval_mtp as eval_cmd
from bebop.play import Completion, complete
from bebop.data.tasks import get as get_task
from bebop.entropy_law import NEAR_UNIFORM
from bebop.data.tokenizer import CharTokenizer
from bebop.engine import Engine
from bebop.engine.lookup import PromptLookup
from bebop.engine.rollout import GenerationConfig
from bebop.heads.evaluate import (
    EvalMTPConfig,
    fit_slopes,
    sweep,
    table2,
    teacher_forced,
    token_records,
    unfitted,
)
from bebop.models.checkpoint import save_head, save_pretrained
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.selfdraft import self_draft_pair
from bebop.models.transformer import Transformer

TINY_MODEL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16)


@pytest.fixture(scope="module")
def tokenizer() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture(scope="module")
def policy(tokenizer):
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=tokenizer.vocab_size, **TINY_MODEL)
    model = Transformer(config).eval()
    heads = {"a": MTPHead(config).eval(), "b": MTPHead(config).eval()}
    return model, heads


def test_token_records_follow_engine_origins():
    c = Completion(tokens=list(range(9)), policy=[True] * 9, text="", entropy=[0.1 * i for i in range(9)],
                   origin=["plain", "accepted", "accepted", "recovered", "accepted", "accepted", "accepted", "bonus",
                           "recovered"])
    records = token_records([c], head="h", method="rs", temperature=1.0)
    assert [(r["pos"], r["accepted"]) for r in records] == [(0, 1), (1, 1), (2, 0), (0, 1), (1, 1), (2, 1), (0, 0)]
    assert [r["entropy"] for r in records] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8])
    assert all(r["head"] == "h" and r["method"] == "rs" and r["temperature"] == 1.0 for r in records)


def test_sweep_rows_and_token_records_match_the_counters(policy, tokenizer, tmp_path):
    model, heads = policy
    config = EvalMTPConfig.tiny(heads=tuple(heads))
    from bebop.runlog import load_run
    from bebop.runlog.session import open_session

    with open_session(tmp_path / "run", config, kind="eval-mtp").begin() as run:
        rows = sweep(model, tokenizer, heads, config, run, progress=False)
    assert len(rows) == len(config.temperatures) * len(heads) * len(config.methods)
    tokens = load_run(tmp_path / "run").streams["tokens"]
    for row in rows:
        mine = tokens[(tokens["head"] == row["head"]) & (tokens["method"] == row["method"])
                      & (tokens["temperature"] == row["temperature"])]
        # Every accepted draft the row kept is one record with accepted=1. The counters also count drafts
        # accepted in a row's last step and then cut off by its token budget: at most γ per prompt.
        counted = round(row["acceptance_rate"] * row["num_draft_tokens"])
        assert 0 <= counted - int(mine.accepted.sum()) <= config.num_prompts * config.gamma
        assert len(mine) >= row["num_draft_tokens"] / config.gamma - config.num_prompts  # one per verify step
        assert set(mine.pos) <= set(range(config.gamma))
        assert 0 <= row["d_tv_mean"] <= 1 and 0 <= row["acceptance_rate"] <= 1
        assert row["draft_entropy_mean"] == pytest.approx(mine.entropy.mean(), rel=1e-4)
    temperature, t2 = table2(rows)
    assert temperature == 1.0 and {r["head"] for r in t2} == set(heads)
    # A random-init policy is near uniform over its vocabulary (H ≈ ln V): no law is offered there, and eval-mtp
    # says why for every pair (tests/test_cli_errors.py checks the fits the law's own range allows)
    assert all(r["draft_entropy_mean"] > NEAR_UNIFORM * r["max_entropy"] for r in rows)
    assert fit_slopes(rows) == [] and all("near uniform" in why for why in unfitted(rows, []).values())
    assert len(unfitted(rows, [])) == len(heads) * len(config.methods) * len(config.tasks)


def test_complete_pools_counters_at_chosen_depths_and_skips_dtv_when_asked(policy, tokenizer):
    """complete() with gamma="auto" returns the engine's counters pooled over the depths it chose (no error for the
    string γ); a sweep without teacher forcing leaves d_TV undefined, not 0."""
    model, heads = policy
    task = get_task("math")
    examples = task.sample(3, seed=1)
    config = GenerationConfig(max_new_tokens=16, gamma="auto", max_gamma=3, seed=0)
    done, stats = complete(Engine(model, heads["a"]), tokenizer, task, examples, config)
    assert len(done) == 3 and stats["spec/gamma"] == 3 and stats["spec/num_drafts"] >= 0
    rows = sweep(model, tokenizer, {"a": heads["a"]},
                 EvalMTPConfig(heads=("a",), methods=("rs",), temperatures=(1.0,), num_prompts=2, max_new_tokens=8,
                               teacher_forced=False), progress=False)
    assert rows[0]["d_tv_mean"] != rows[0]["d_tv_mean"] and 0 <= rows[0]["acceptance_rate"] <= 1  # NaN


def test_teacher_forced_dtv_is_zero_for_an_exact_draft_and_over_s_bounded_by_coverage(tokenizer):
    config = ModelConfig.tiny(vocab_size=tokenizer.vocab_size, **TINY_MODEL)
    model, head = self_draft_pair(config, seed=1)
    task = get_task("math")
    examples = task.sample(4, seed=0)
    gen = GenerationConfig(max_new_tokens=20, temperature=1.0, gamma=3, method="rs", seed=0)
    completions, stats = complete(Engine(model, head), tokenizer, task, examples, gen)
    prompts = [tokenizer.encode(e.prompt) for e in examples]
    dtv, share = teacher_forced(model, head, prompts, completions, 3, 1.0)
    assert max(dtv) < 1e-4 and share == 1.0  # no draft vocabulary: the whole of p is draftable
    assert stats["spec/num_accepted_tokens"] == stats["spec/num_draft_tokens"]
    other = MTPHead(config)  # an untrained head is far from p
    assert min(teacher_forced(model, other, prompts, completions, 3, 1.0)[0]) > 0.05
    # The exact draft restricted to the 20 ids the sequences use most: its acceptance is exactly p(S) at step 1
    counts = torch.bincount(torch.tensor([t for c in completions for t in c.tokens]), minlength=config.vocab_size)
    head.use_draft_vocab(counts.argsort(descending=True, stable=True)[:20].sort().values)
    try:
        dtv, share = teacher_forced(model, head, prompts, completions, 3, 1.0)
    finally:
        head.use_draft_vocab(None)
    assert 0 < share < 1 and abs((1 - dtv[0]) - share) < 1e-4


def test_command_writes_tables_and_rejects_bad_input(policy, tokenizer, tmp_path):
    model, heads = policy
    save_pretrained(model, tmp_path / "policy")
    tokenizer.save(tmp_path / "policy")
    for name, head in heads.items():
        save_head(head, tmp_path / name)
    parser = argparse.ArgumentParser()
    eval_cmd.add_arguments(parser)
    base = ["--policy", str(tmp_path / "policy"), "--num-prompts", "3", "--max-new-tokens", "16",
            "--temperatures", "0.5", "1.0", "1.5", "--dtype", "fp32"]
    args = parser.parse_args(base + ["--heads", f"first={tmp_path / 'a'}", str(tmp_path / "b"),
                                     "--run-dir", str(tmp_path / "run")])
    assert eval_cmd.run(args) == 0
    rows = json.loads((tmp_path / "run" / "table.json").read_text())
    assert {r["head"] for r in rows} == {"first", "b"} and len(rows) == 12
    assert (tmp_path / "run" / "table.csv").read_text().startswith("task,temperature,head,method,acceptance_rate")
    assert json.loads((tmp_path / "run" / "fits.json").read_text()) == []  # a random policy: near uniform, no law
    with pytest.raises(FileNotFoundError, match="neither"):
        eval_cmd.run(parser.parse_args(base + ["--heads", str(tmp_path / "missing")]))
    with pytest.raises(ValueError, match="methods"):
        eval_cmd.run(parser.parse_args(base + ["--heads", str(tmp_path / "a"), "--methods", "beam"]))
    with pytest.raises(ValueError, match="task"):
        eval_cmd.run(parser.parse_args(base + ["--heads", str(tmp_path / "a"), "--tasks", "chess"]))
    wide = ModelConfig.tiny(vocab_size=tokenizer.vocab_size, **{**TINY_MODEL, "hidden_size": 48})
    save_head(MTPHead(wide), tmp_path / "wide")
    with pytest.raises(ValueError, match="hidden_size"):
        eval_cmd.run(parser.parse_args(base + ["--heads", str(tmp_path / "wide")]))
    narrow = ModelConfig.tiny(vocab_size=50, **TINY_MODEL)
    with pytest.raises(ValueError, match="vocab_size"):
        Engine(model, MTPHead(narrow))


def test_prompt_lookup_sits_beside_the_heads_as_a_baseline(policy, tokenizer):
    """--heads lookup: drafted by prompt lookup through the same engine, once (as TO: its q is one-hot), with no
    teacher-forced d_TV (it has no q to compare)."""
    model, heads = policy
    rows = sweep(model, tokenizer, {"a": heads["a"], "lookup": PromptLookup()},
                 EvalMTPConfig(heads=("a", "lookup"), methods=("to", "rs"), temperatures=(1.0,), num_prompts=2,
                               max_new_tokens=12), progress=False)
    assert [(r["head"], r["method"]) for r in rows] == [("a", "to"), ("a", "rs"), ("lookup", "to")]
    lookup = rows[-1]
    assert lookup["num_draft_tokens"] > 0 and math.isnan(lookup["d_tv_mean"]) and lookup["draft_vocab"] is None


def test_a_sweep_measures_a_task_on_its_held_out_split(policy, tokenizer, monkeypatch):
    """Tasks with a held-out split (the code styles' functions, chat's requests) are measured on it, never on the
    prompts a head's corpus draws; chat, which has no verifier, reports no reward (NaN), code a number."""
    import bebop.heads.evaluate as evaluate

    model, heads = policy
    seen, real = {}, evaluate.evaluate_one

    def evaluate_one(model, tokenizer, head, task, examples, **kwargs):
        seen[task.name] = examples
        return real(model, tokenizer, head, task, examples, **kwargs)

    monkeypatch.setattr(evaluate, "evaluate_one", evaluate_one)
    config = EvalMTPConfig(heads=("a",), tasks=("code_doc", "chat"), methods=("rs",), temperatures=(1.0,),
                           num_prompts=3, max_new_tokens=4, teacher_forced=False)
    rows = {row["task"]: row for row in sweep(model, tokenizer, {"a": heads["a"]}, config, progress=False)}
    assert {e.meta["split"] for e in seen["code_doc"]} == {"heldout"}
    held = {e.meta["template"] for e in get_task("chat").heldout().sample(100, seed=0)}
    assert {e.meta["template"] for e in seen["chat"]} <= held
    assert rows["chat"]["reward"] != rows["chat"]["reward"] and 0 <= rows["code_doc"]["reward"] <= 1


def test_fits_speak_accept_length_per_nat_and_leave_out_near_uniform_points():
    """Finding 1 in its unit (accept length per nat, the acceptance rate's slope in brackets), over the temperatures
    where the policy is not near uniform: a sweep point at 8 nats of a 49,152-id vocabulary (ln V = 10.8) is left
    out of the law, and the printed table says so."""
    import io

    from rich.console import Console

    rows = []
    for t, h in ((0.3, 0.2), (0.5, 0.4), (0.7, 0.8), (1.0, 1.5), (1.5, 8.0)):
        rate = 0.8 - 0.2 * h if h < 5 else 0.02  # near uniform: nothing accepted, far off the line
        rows.append({"task": "math", "temperature": t, "head": "e2e_tv", "method": "rs", "acceptance_rate": rate,
                     "num_accepted_tokens": round(1000 * rate), "num_draft_tokens": 1000,
                     "accept_length": 1 + 3 * rate, "draft_entropy_mean": h, "d_tv_mean": 0.2, "coverage": math.nan,
                     "max_entropy": math.log(49_152)})
    (fit,) = fit_slopes(rows)
    assert fit["n"] == 4 and fit["slope"] == pytest.approx(-0.2) and fit["length_slope"] == pytest.approx(-0.6)
    assert any("left out of the law" in flag for flag in fit["flags"])
    out = io.StringIO()
    eval_cmd.print_tables(rows, [fit], console=Console(file=out, width=250))
    text = out.getvalue()
    assert "accept length per nat" in text and "(-0.200 [" in text and "-0.600 [" in text
    assert "1 point(s) above 7.6 nats" in text and "tok/s" not in text  # the flag printed; no unstable speed column


def test_fits_draw_one_line_per_task():
    """Tasks sit at their own levels (a head that never saw code accepts little of it at any entropy): one line per
    task, each with its own slope, never one line across both, which would measure the gap between them."""
    rows = []
    for task, level, slope in (("math", 0.6, -0.15), ("jsonl:/data/code.jsonl", 0.07, 0.0)):
        for t, h in ((0.3, 0.1), (0.5, 0.3), (0.7, 0.6), (1.0, 1.2)):
            rate = level + slope * h
            rows.append({"task": task, "temperature": t, "head": "ce", "method": "to", "acceptance_rate": rate,
                         "accept_length": 1 + 3 * rate, "draft_entropy_mean": h + (task == "math") * 0.05,
                         "max_entropy": math.log(49_152)})
    fits = {f["task"]: f for f in fit_slopes(rows)}
    assert set(fits) == {"math", "jsonl:/data/code.jsonl"}
    assert fits["math"]["slope"] == pytest.approx(-0.15) and fits["math"]["length_slope"] == pytest.approx(-0.45)
    assert fits["jsonl:/data/code.jsonl"]["slope"] == pytest.approx(0.0, abs=1e-9)
    assert unfitted(rows, list(fits.values())) == {}
    assert set(unfitted(rows, [fits["math"]])) == {("jsonl:/data/code.jsonl", "ce", "to")}  # named by its task
