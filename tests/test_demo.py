"""`bebop demo` end to end on a tiny stand-in for the embedded default (same directory layout)."""

import argparse

import pytest
import torch

from bebop.commands import demo
from bebop.data.tokenizer import CharTokenizer
from bebop.models.checkpoint import save_head, save_pretrained
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer
from bebop.runlog import list_runs, load_run


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


def test_demo_runs_both_jobs_and_prints_the_summary(policy_dir, tmp_path, capsys):
    args = parse("--policy", str(policy_dir), "--steps", "3", "--prompts", "2", "--group", "2",
                 "--max-new-tokens", "16", "--out", str(tmp_path / "runs"), "--threads", "1")
    assert demo.run(args) == 0
    out = capsys.readouterr().out
    assert "end-to-end speedup" in out and "bebop dashboard --runs" in out and "accept length" in out
    assert "4 rows decode together" in out and "--self-draft" in out
    runs = list_runs(tmp_path / "runs")
    assert sorted(r.path.name for r in runs) == ["mtp-rs-e2e_tv", "no-mtp"]
    assert all(r.state == "finished" and r.kind == "rl" for r in runs)
    for info in runs:
        run = load_run(info.path)
        assert list(run.streams["train"]["step"]) == [0, 1, 2]
        spec = "spec/accept_length" in run.streams["train"].columns
        assert spec == (info.path.name == "mtp-rs-e2e_tv")
        assert run.meta["config"]["rollout"] == ("rs" if spec else "none")


def test_demo_bad_input(policy_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        demo.run(parse("--policy", str(policy_dir), "--task", "chess", "--out", str(tmp_path)))
    with pytest.raises(FileNotFoundError):
        demo.run(parse("--policy", str(tmp_path / "nowhere"), "--out", str(tmp_path)))
    assert not any(tmp_path.iterdir())  # nothing written on bad input
