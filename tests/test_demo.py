"""`bebop demo` end to end on a tiny stand-in for the embedded default (same directory layout)."""

import argparse
import math

import pytest
import torch

from bebop.commands import demo
from bebop.data.tokenizer import CharTokenizer
from bebop.models.checkpoint import save_head, save_pretrained
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer
from bebop.runlog import list_runs, load_run

RUN_NAMES = ["rows2-mtp-rs-e2e_tv", "rows2-no-mtp", "rows4-mtp-rs-e2e_tv", "rows4-no-mtp"]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("default")
    tok = CharTokenizer()
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512)
    save_pretrained(Transformer(config), path)
    tok.save(path)
    for name in ("ce", "e2e_tv"):
        save_head(MTPHead(config), path / "heads" / name)
    return path


def parse(*argv):
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_demo_runs_both_regimes_and_prints_speedups_beside_their_bounds(policy_dir, tmp_path, capsys):
    args = parse("--policy", str(policy_dir), "--steps", "3", "--prompts", "2", "--small-prompts", "1", "--group", "2",
                 "--max-new-tokens", "16", "--out", str(tmp_path / "runs"), "--threads", "1")
    assert demo.run(args) == 0
    out = capsys.readouterr().out
    speed = out[out.index("rows per step"):out.index("predicted: from measured costs")]
    assert [line.split()[1] for line in speed.splitlines() if line.split()[1:2] in (["4"], ["2"])] == ["4", "2"]
    assert "median over steady steps" in " ".join(out.split()) and "Why they differ" in out
    assert "bebop dashboard --runs" in out and "accept length" in out and "--self-draft" in out
    assert f"(policy {policy_dir}, e2e_tv head, frozen)" in " ".join(out.split())  # what made the runs
    assert "γ=auto chose γ=" in out and " at 4 rows" in out and " at 2 rows" in out  # the depth of each regime
    runs = list_runs(tmp_path / "runs")
    assert sorted(r.path.name for r in runs) == RUN_NAMES
    assert all(r.state == "finished" and r.kind == "rl" for r in runs)
    for info in runs:
        run = load_run(info.path)
        assert list(run.streams["train"]["step"]) == [0, 1, 2]
        spec = "spec/accept_length" in run.streams["train"].columns
        assert spec == info.path.name.endswith("mtp-rs-e2e_tv")
        assert run.meta["config"]["method"] == ("rs" if spec else "none")
        assert run.meta["config"]["prompts_per_step"] == (2 if info.path.name.startswith("rows4") else 1)
        if spec:  # gamma="auto": every engine step's depth counted
            train = run.streams["train"]
            chosen = sum(train[f"spec/num_gamma_chosen/{g}"].sum() for g in range(run.meta["config"]["max_gamma"] + 1))
            assert run.meta["config"]["gamma"] == "auto" and chosen == train["engine/num_steps"].sum()



def test_demo_under_gamma_rows_says_each_rows_mean_depth_not_autos_choice(policy_dir, tmp_path, capsys):
    args = parse("--policy", str(policy_dir), "--steps", "2", "--prompts", "2", "--small-prompts", "0", "--group", "2",
                 "--max-new-tokens", "16", "--out", str(tmp_path / "runs"), "--threads", "1", "--gamma", "rows")
    assert demo.run(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "γ=rows gave each row its own depth, a mean γ of " in out and " per row-step at 4 rows (" in out
    assert "γ=auto chose" not in out

def records(steps, *, draft_s, verify_s, accepted):
    """Train records of one run: 10 engine steps a step, `accepted` drafts accepted per engine step (γ = 3)."""
    rows = []
    for step in range(steps):
        row = {"step": step, "timing_s/step": 1.0, "timing_s/gen": 1.0, "timing_s/update_actor": 0.5,
               "timing_s/update_mtp": 0.0, "timing_s/overlap": 0.0, "critic/score/mean": 0.5, "actor/entropy": 0.3,
               "response_length/mean": 10.0, "perf/throughput": 10.0, "engine/num_steps": 10,
               "engine/draft_s": 10 * draft_s, "engine/verify_s": 10 * verify_s, "engine/advance_s": 0.0}
        if accepted is not None:
            row.update({"spec/gamma": 3, "spec/method": "rs", "spec/num_drafts": 10, "spec/num_draft_tokens": 30,
                        "spec/num_accepted_tokens": 10 * accepted})
        rows.append(row)
    return rows


def test_the_prediction_divides_tokens_per_row_step_by_the_measured_step_cost():
    plain = records(4, draft_s=0.0, verify_s=0.01, accepted=None)
    spec = records(4, draft_s=0.004, verify_s=0.02, accepted=2)  # a step costs (0.02 + 0.004) / 0.01 = 2.4 plain
    speed = demo.regime(plain, spec, rows=32)["speed"]
    assert speed.tokens_per_row_step == pytest.approx(3.0) and speed.step_cost == pytest.approx(2.4)
    assert speed.predicted == pytest.approx(3.0 / 2.4)
    assert speed.rollout == 1.0 and not speed.beyond and speed.note() == ""
    no_costs = [{k: v for k, v in r.items() if not k.startswith("engine/")} for r in spec]
    assert math.isnan(demo.regime(plain, no_costs, rows=32)["speed"].predicted)  # never a made-up one


def _regime(rows, *, verify_s, accepted):
    return demo.regime(records(4, draft_s=0.0, verify_s=0.01, accepted=None),
                       records(4, draft_s=0.003, verify_s=verify_s, accepted=accepted), rows=rows)


def test_why_they_differ_names_only_the_factor_that_differs():
    same_cost = [_regime(32, verify_s=0.017, accepted=1), _regime(4, verify_s=0.017, accepted=2)]
    text = demo.why_they_differ(same_cost)
    assert "Most of the gap is the tokens per row-step (2.00 at 32 rows, 3.00 at 4)" in text
    assert "the step cost" not in text  # 2.00 plain steps in both: not a reason
    same_tokens = [_regime(32, verify_s=0.027, accepted=2), _regime(4, verify_s=0.012, accepted=2)]
    expected = "Most of the gap is the step cost (3.00 plain steps at 32 rows, 1.50 at 4)"
    assert expected in demo.why_they_differ(same_tokens)
    close = [_regime(32, verify_s=0.017, accepted=2), _regime(4, verify_s=0.0172, accepted=2)]
    assert "within 5% of each other" in demo.why_they_differ(close)


def test_demo_bad_input(policy_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        demo.run(parse("--policy", str(policy_dir), "--task", "chess", "--out", str(tmp_path)))
    with pytest.raises(ValueError, match="--small-prompts"):
        demo.run(parse("--policy", str(policy_dir), "--small-prompts", "-1", "--out", str(tmp_path)))
    with pytest.raises(FileNotFoundError):
        demo.run(parse("--policy", str(tmp_path / "nowhere"), "--out", str(tmp_path)))
    assert not any(tmp_path.iterdir())  # nothing written on bad input
