"""`bebop eval-mtp`: records agree with the engine's counters, d_TV alignment, tables, fits, bad input;
and what issue 4 says the shipped heads must show (slow: reads bebop/assets/default)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from claim_stats import K, jackknife_se

import bebop.commands.eval_mtp as eval_cmd
from bebop.commands.eval_mtp import EvalMTPConfig, fit_slopes, sweep, table2, teacher_forced_dtv, token_records
from bebop.data.completions import Completion, complete
from bebop.data.tasks import get as get_task
from bebop.data.tokenizer import CharTokenizer
from bebop.engine import Engine
from bebop.engine.rollout import GenerationConfig
from bebop.metrics import fit_entropy_law
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
    c = Completion(tokens=list(range(9)), policy=[True] * 9, entropy=[0.1 * i for i in range(9)],
                   origin=["plain", "accepted", "accepted", "recovered", "accepted", "accepted", "accepted", "bonus",
                           "recovered"])
    records = token_records([c], head="h", method="rs", temperature=1.0)
    assert [(r["pos"], r["accepted"]) for r in records] == [(0, 1), (1, 1), (2, 0), (0, 1), (1, 1), (2, 1), (0, 0)]
    assert [r["entropy"] for r in records] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8])
    assert all(r["head"] == "h" and r["method"] == "rs" and r["temperature"] == 1.0 for r in records)


def test_sweep_rows_and_token_records_match_the_counters(policy, tokenizer, tmp_path):
    model, heads = policy
    config = EvalMTPConfig.tiny(heads=tuple(heads))
    from bebop.runlog import RunWriter, load_run

    with RunWriter(tmp_path / "run", config, kind="eval-mtp") as writer:
        rows = sweep(model, tokenizer, heads, config, writer, progress=False)
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
    fits = fit_slopes(rows)
    assert {(f["head"], f["method"]) for f in fits} == {(h, m) for h in heads for m in config.methods}


def test_teacher_forced_dtv_is_zero_for_an_exact_draft(tokenizer):
    config = ModelConfig.tiny(vocab_size=tokenizer.vocab_size, **TINY_MODEL)
    model, head = self_draft_pair(config, seed=1)
    task = get_task("math")
    examples = task.sample(4, seed=0)
    gen = GenerationConfig(max_new_tokens=20, temperature=1.0, gamma=3, method="rs", seed=0)
    completions, stats = complete(Engine(model, head), tokenizer, task, examples, gen)
    prompts = [tokenizer.encode(e.prompt) for e in examples]
    assert max(teacher_forced_dtv(model, head, prompts, completions, 3, 1.0)) < 1e-4
    assert stats["spec/num_accepted_tokens"] == stats["spec/num_draft_tokens"]
    other = MTPHead(config)  # an untrained head is far from p
    assert min(teacher_forced_dtv(model, other, prompts, completions, 3, 1.0)) > 0.05


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
    assert len(json.loads((tmp_path / "run" / "fits.json").read_text())) == 4
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


# ----------------------------------------------------------------------------------------------------------
# What issue 4 says the shipped heads must show. Acceptance comes from the engine's counters on held-out math
# prompts; 96 prompts give about 1.8k verify steps per (head, method). Its standard error is resampled over whole
# prompts (claim_stats.jackknife_se): at T=1 about 0.9-1.2 points per rate and 1.1-1.2 per paired difference,
# 1.5-2x the binomial sqrt(p(1-p)/n) over draft tokens, which treats the correlated drafts of one step and the
# steps of one completion as independent.
SHIPPED_HEADS = ("ce", "tv", "e2e_tv")


@pytest.fixture(scope="module")
def shipped():
    from bebop.default import load_default

    torch.set_num_threads(1)
    default = load_default()
    missing = [n for n in SHIPPED_HEADS if n not in default.heads]
    assert not missing, f"the shipped default lacks heads {missing}"
    return default


def _prompt_counts(completion: Completion, gamma: int) -> tuple[int, int, float, int]:
    """(accepted drafts, drafted tokens, entropy sum over reached draft positions, reached positions) of one prompt's
    completion, from its token records; every verify step reaches position 0, so it has one record there."""
    records = token_records([completion])
    steps = sum(r["pos"] == 0 for r in records)
    return (sum(r["accepted"] for r in records), gamma * steps, sum(r["entropy"] for r in records), len(records))


def _sweep(default, config: EvalMTPConfig) -> list[dict]:
    """`sweep`'s rows, each with "prompts": the per-prompt counts of its completions, which the standard errors
    resample. Every (temperature, head, method) answers the same prompts (a sweep with fewer prompts answers a
    prefix of them), so prompt i is one unit across rows."""
    counts, evaluate = [], eval_cmd.evaluate_one

    def keep_counts(*args, **kwargs):
        row, completions = evaluate(*args, **kwargs)
        counts.append([_prompt_counts(c, config.gamma) for c in completions])
        return row, completions

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(eval_cmd, "evaluate_one", keep_counts)
        rows = sweep(default.model, default.tokenizer, {n: default.heads[n] for n in config.heads}, config,
                     progress=False)
    assert len(rows) == len(counts)
    for row, prompts in zip(rows, counts):
        assert sum(p[1] for p in prompts) == row["num_draft_tokens"], "per-prompt drafts must add up to the counters"
    return [{**row, "prompts": prompts} for row, prompts in zip(rows, counts)]


@pytest.fixture(scope="module")
def shipped_sweep(shipped):
    return (_sweep(shipped, EvalMTPConfig(heads=SHIPPED_HEADS, temperatures=(1.0,), num_prompts=96))
            + _sweep(shipped, EvalMTPConfig(heads=("ce", "e2e_tv"), temperatures=(0.4, 0.7, 1.3), num_prompts=48)))


@pytest.fixture(scope="module")
def ranking_sweep(shipped):
    """RS and TO at T=1 on 384 further held-out prompts (seed 2, fixed before it was first measured): the ranking
    and TO-spread claims compare heads about a point apart, which 96 prompts (standard error ~1.1 points per
    difference) cannot resolve; 384 prompts give ~0.5-0.6."""
    return _sweep(shipped, EvalMTPConfig(heads=SHIPPED_HEADS, methods=("rs", "to"), temperatures=(1.0,), num_prompts=384,
                                         seed=2))


def _acceptance(rows: list[dict], method: str, temperature: float = 1.0) -> dict[str, float]:
    return {r["head"]: 100 * r["acceptance_rate"] for r in rows if r["temperature"] == temperature
            and r["method"] == method}


def _row(rows: list[dict], head: str, method: str, temperature: float = 1.0) -> dict:
    (row,) = [r for r in rows if (r["head"], r["method"], r["temperature"]) == (head, method, temperature)]
    return row


def _kept(row: dict, drop: int, num: int, den: int) -> float:
    """sum(count num) / sum(count den) over the row's prompts without prompt `drop` (kept if the row has fewer)."""
    kept = [p for i, p in enumerate(row["prompts"]) if i != drop]
    return sum(p[num] for p in kept) / sum(p[den] for p in kept)


def _rate(row: dict, drop: int) -> float:
    return _kept(row, drop, 0, 1)  # accepted / drafted


def _entropy(row: dict, drop: int) -> float:
    return _kept(row, drop, 2, 3)  # mean H(p) at the reached draft positions


def _difference(rows: list[dict], a: tuple[str, str], b: tuple[str, str]) -> tuple[float, float]:
    """Acceptance of (head, method) a minus b at T=1 in points, from the engine's counters, and its standard error
    over prompts (paired: both rows answered the same prompts)."""
    ra, rb = _row(rows, *a), _row(rows, *b)
    se = jackknife_se(lambda i: 100 * (_rate(ra, i) - _rate(rb, i)), len(ra["prompts"]))
    return 100 * (ra["acceptance_rate"] - rb["acceptance_rate"]), se


def _slope(rows: list[dict], head: str, method: str) -> tuple[float, float]:
    """`fit_slopes`' slope of acceptance on draft entropy over the temperatures, and its standard error over
    prompts (each prompt left out of every temperature at once, so both axes' noise counts)."""
    points = [r for r in rows if (r["head"], r["method"]) == (head, method)]
    (fit,) = fit_slopes(points)

    def without(i: int) -> float:
        return fit_entropy_law([_entropy(r, i) for r in points], [_rate(r, i) for r in points],
                               n_bootstrap=0).slope

    return fit["slope"], jackknife_se(without, max(len(r["prompts"]) for r in points))


def _claims(**measured: tuple[float, float]) -> str:
    return ", ".join(f"{name} {value:+.2f} (SE {se:.2f})" for name, (value, se) in measured.items())


# What issue 4 asks for and the shipped heads do NOT show yet. strict: when a retrained head makes one
# pass, the suite fails until its xfail mark is removed.
_NOT_YET = "measured on the shipped heads: does not hold yet (see bebop.default and the issue note)"


# What holds on the shipped heads (measured at T=1, gamma=3; recipe and sweeps in bebop.default's docstring), with
# each claim's margin K standard errors of its own measurement (claim_stats), so that noise alone fails it with
# probability < 1e-3. Measured in bf16 (fp32 on a CPU without fast bf16, where the samples differ):
# 96 math prompts: RS ce 73.9 / tv 78.3 / e2e_tv 78.6 % (fp32 73.8 / 79.1 / 79.2), TO 67.1 / 67.6 / 68.6 %
# (fp32 67.7 / 68.7 / 68.5); 384 further prompts: RS 76.1 / 78.3 / 79.4 %, TO 67.0 / 68.2 / 68.9 %.
@pytest.mark.slow
def test_shipped_heads_rs_acceptance_ranks_e2e_tv_over_tv_over_ce(ranking_sweep):
    # bf16: +1.08 (SE 0.62), +2.13 (0.62), +3.21 (0.60)
    top = _difference(ranking_sweep, ("e2e_tv", "rs"), ("tv", "rs"))
    mid = _difference(ranking_sweep, ("tv", "rs"), ("ce", "rs"))
    spread = _difference(ranking_sweep, ("e2e_tv", "rs"), ("ce", "rs"))
    message = _claims(e2e_tv_minus_tv=top, tv_minus_ce=mid, e2e_tv_minus_ce=spread)
    assert top[0] > -K * top[1] and mid[0] > -K * mid[1], message  # e2e_tv > tv >= ce
    assert spread[0] > 3.0 - K * spread[1], message  # e2e_tv - ce >= 3 points


@pytest.mark.slow
def test_shipped_tv_head_beats_ce_under_rs(shipped_sweep):
    # bf16: +4.34 (SE 1.07)
    diff = _difference(shipped_sweep, ("tv", "rs"), ("ce", "rs"))
    assert diff[0] > 2.0 - K * diff[1], _claims(tv_minus_ce=diff)  # tv - ce >= 2 points


@pytest.mark.slow
def test_shipped_heads_under_to_tv_and_ce_barely_differ(shipped_sweep):
    # bf16: +0.53 (SE 1.17); fp32: +1.07
    diff = _difference(shipped_sweep, ("tv", "to"), ("ce", "to"))
    assert abs(diff[0]) < 1.0 + K * diff[1], _claims(tv_minus_ce=diff)  # |tv - ce| < 1 point


@pytest.mark.slow
def test_shipped_heads_rs_beats_to_for_every_head(shipped_sweep):
    # bf16: ce +6.89 (SE 1.10), tv +10.69 (1.18), e2e_tv +9.95 (1.29)
    diffs = {h: _difference(shipped_sweep, (h, "rs"), (h, "to")) for h in SHIPPED_HEADS}
    assert all(d > -K * se for d, se in diffs.values()), _claims(**diffs)  # RS > TO


@pytest.mark.slow
def test_shipped_heads_to_acceptance_falls_with_entropy(shipped_sweep):
    # bf16: ce -0.33/nat (SE 0.07), e2e_tv -0.52/nat (SE 0.05), over T = 0.4, 0.7, 1.0, 1.3
    slopes = {h: _slope(shipped_sweep, h, "to") for h in ("ce", "e2e_tv")}
    assert all(slope < K * se for slope, se in slopes.values()), _claims(**slopes)  # slope < 0


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=_NOT_YET + ": on the 384 prompts TO accepts 67.0 / 68.2 / 68.9% (ce / tv / "
                   "e2e_tv), a spread of 1.9 points (2.5 in fp32, where a CPU without native bf16 runs); each rate's standard "
                   "error is ~0.5 and each difference's 0.5-0.6, so the spread sits ~1.7 SE above the claim's line: "
                   "seeded, it fails the same way on a given CPU's dtype")
def test_shipped_heads_under_to_the_loss_barely_matters(ranking_sweep):
    acc = list(_acceptance(ranking_sweep, "to").values())
    assert len(acc) == 3 and max(acc) - min(acc) < 1.0, acc


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=_NOT_YET + ": over 4 temperatures TO+CE falls -0.33/nat and RS+CE -0.19, "
                   "but both bootstrap intervals ([-0.95, 0.16], [-0.39, 0.18]) include 0, and RS+e2e_tv's -0.14 is "
                   "0.41x TO+CE's and 0.70x RS+CE's, not <= 1/3 (TO+e2e_tv: -0.52, CI [-0.54, -0.49])")
def test_shipped_heads_entropy_law_slopes(shipped_sweep):
    rows = [r for r in shipped_sweep if r["head"] in ("ce", "e2e_tv")]
    fits = {(f["head"], f["method"]): f for f in fit_slopes(rows)}
    to, rs_ce, rs_tv = fits[("ce", "to")], fits[("ce", "rs")], fits[("e2e_tv", "rs")]
    assert to["slope_ci"][1] < 0 and rs_ce["slope_ci"][1] < 0, (to, rs_ce)  # clearly negative
    assert abs(rs_tv["slope"]) <= abs(to["slope"]) / 3 and abs(rs_tv["slope"]) <= abs(rs_ce["slope"]) / 3, fits
