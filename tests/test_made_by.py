"""What made a run (issue 46: runs that name their model): every job that loads a policy records it and its head in
meta.json (`policy`, `head`: docs/runs.md), the weights' hash names the weights, `bebop.speedup` pairs runs by it,
and `bebop rl` takes the demo's size flags, defaults to --gamma auto and closes with its MTP numbers and its makers.
Each job runs for real on the embedded default, at the smallest sizes its flags allow."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from cli_checks import one_error_line

from bebop import speedup
from bebop.cli import main
from bebop.default import DEFAULT_DIR, load_default
from bebop.metrics import derive, pool
from bebop.models.checkpoint import load_pretrained, save_pretrained, weights_hash
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer
from bebop.runlog.setup import head_of, made_by, policy_of

SMALL_RL = ["--steps", "2", "--prompts", "1", "--group", "2", "--max-new-tokens", "8", "--threads", "1"]


def _meta(run: Path) -> dict:
    return json.loads((run / "meta.json").read_text())


def _default_policy(dtype: str) -> dict:
    return {"name": "default", "hash": weights_hash(DEFAULT_DIR), "dtype": dtype,
            "parameters": load_default().model.num_parameters()}


def _head(name: str, objective: str | None = None, depth: int = 5) -> dict:
    return {"name": name, "kind": "mtp", "objective": objective or name, "depth": depth, "draft_vocab": None}


LOOKUP = {"name": "lookup", "kind": "lookup", "objective": None, "depth": None, "draft_vocab": None}


# ------------------------------------------------------------------------------------------- every job records them
@pytest.mark.parametrize("argv, runs, head", [
    (["rl", *SMALL_RL, "--rollout", "rs", "--dtype", "fp32", "--out", "R"], ["R"], _head("e2e_tv")),
    (["rl", *SMALL_RL, "--rollout", "none", "--dtype", "fp32", "--out", "R"], ["R"], None),
    (["eval-mtp", "--heads", "ce", "lookup", "--methods", "rs", "--temperatures", "1.0", "--num-prompts", "2",
      "--max-new-tokens", "8", "--gamma", "2", "--no-dtv", "--dtype", "fp32", "--run-dir", "R"], ["R"],
     [_head("ce"), LOOKUP]),
    (["train-mtp", "--tiny", "--steps", "2", "--objective", "ce", "--dtype", "fp32", "--out", "H", "--run-dir", "R"],
     ["R"], _head("H", "ce", depth=3)),
    (["bench", "rl", "--tasks", "math", "--steps", "2", "--prompts", "1", "--group", "2", "--max-new-tokens", "8",
      "--dtype", "fp32", "--out", "B"], ["B/math-none-0", "B/math-rs-e2e_tv-0"], [None, _head("e2e_tv")]),
], ids=["rl", "rl-plain", "eval-mtp", "train-mtp", "bench-rl"])
def test_every_job_records_the_policy_and_head_that_made_it(argv, runs, head):
    assert main(argv) == 0
    heads = head if argv[:2] == ["bench", "rl"] else [head]
    for run, expected in zip(runs, heads):
        meta = _meta(Path(run))
        assert meta["policy"] == _default_policy("float32"), run
        assert meta["head"] == expected, run


def test_the_demo_records_them_for_each_of_its_runs(tmp_path):
    assert main(["demo", "--steps", "2", "--prompts", "1", "--small-prompts", "0", "--group", "2",
                 "--max-new-tokens", "8", "--threads", "1", "--dtype", "fp32", "--out", str(tmp_path)]) == 0
    runs = {run.name: _meta(run) for run in next(tmp_path.iterdir()).iterdir()}
    assert set(runs) == {"rows2-no-mtp", "rows2-mtp-rs-e2e_tv"}
    assert all(meta["policy"] == _default_policy("float32") for meta in runs.values())
    assert runs["rows2-no-mtp"]["head"] is None and runs["rows2-mtp-rs-e2e_tv"]["head"] == _head("e2e_tv")


def test_task_sweep_records_its_policy():
    pytest.importorskip("reasoning_gym")
    assert main(["task-sweep", "--temperatures", "1.0", "--num-problems", "2", "--max-new-tokens", "8", "--dtype",
                 "fp32", "--run-dir", "R"]) == 0
    meta = _meta(Path("R"))
    assert meta["policy"] == _default_policy("float32") and meta["head"] is None  # it decodes plainly


def test_a_run_resumes_only_from_the_policy_it_started_from(tmp_path, capsys):
    """The checkpoint holds the weights the run trained; resumed with another --policy, meta.json would name a policy
    it never ran: refused in one line."""
    other = tmp_path / "other"
    shutil.copytree(DEFAULT_DIR, other)
    model = load_default(dtype=torch.float32).model
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1.0  # the same shapes, other weights
    save_pretrained(model.to(torch.bfloat16), other)
    argv = ["rl", *SMALL_RL, "--no-progress", "--checkpoint-every", "1", "--out", "R"]
    assert main(argv) == 0
    argv[argv.index("--steps") + 1] = "3"
    assert main([*argv, "--resume", "--policy", str(other)]) == 2
    line = one_error_line(capsys)
    assert f"it started from policy default (weights {weights_hash(DEFAULT_DIR)[:8]}), not {other}" in line
    assert main([*argv, "--resume"]) == 0  # from the policy it started from, it goes on


# ---------------------------------------------------------------------------------------------- the weights' hash
def test_the_hash_names_the_weights_not_the_files(tmp_path):
    config = ModelConfig.tiny(vocab_size=64)
    torch.manual_seed(0)
    model = Transformer(config)
    save_pretrained(model, tmp_path / "a")
    save_pretrained(model, tmp_path / "b", mtp=MTPHead(config))  # a head stored beside the weights is no policy
    assert weights_hash(tmp_path / "a") == weights_hash(tmp_path / "b")
    loaded, _ = load_pretrained(tmp_path / "b")
    assert (loaded.name_or_path, loaded.weights_hash) == (str(tmp_path / "b"), weights_hash(tmp_path / "a"))
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1e-3  # one weight
    save_pretrained(model, tmp_path / "c")
    assert weights_hash(tmp_path / "c") != weights_hash(tmp_path / "a")
    save_pretrained(model.to(torch.bfloat16), tmp_path / "d")
    assert weights_hash(tmp_path / "d") != weights_hash(tmp_path / "c")  # other numbers at another dtype
    assert Transformer(config).weights_hash is None  # built in memory: no file says what it is


def test_speedups_pair_runs_by_the_hash_of_their_weights():
    def meta(name: str, digest: str) -> dict:
        return {"kind": "rl", "config": {"prompts_per_step": 8, "group_size": 4},
                "policy": {"name": name, "hash": digest, "dtype": "bfloat16", "parameters": 3175168}}

    assert speedup.differences(meta("smollm2", "ab"), meta("smollm2", "cd")) == ["policy"]  # same name, other weights
    assert speedup.differences(meta("smollm2", "ab"), meta("/cache/smollm2", "ab")) == []  # the same weights


# ------------------------------------------------------------------------------------------------- how they read
def test_what_made_a_run_reads_for_new_runs_and_old_ones():
    new = {"policy": {"name": "smollm2", "hash": "6b54f4a29047ff", "dtype": "bfloat16", "parameters": 134515008},
           "head": {"name": "e2e_tv", "kind": "mtp", "objective": "e2e_tv", "depth": 5, "draft_vocab": 8192}}
    assert (policy_of(new), head_of(new)) == ("smollm2", "e2e_tv")
    assert made_by(new) == ("policy smollm2 (134.5M parameters, bfloat16, weights 6b54f4a2) · head e2e_tv (e2e_tv "
                            "loss, trained depth 5, draft vocabulary 8,192)")
    plain = {**new, "head": None}
    assert head_of(plain) == "none" and made_by(plain).endswith("· no head (plain decoding)")
    assert made_by({**new, "head": [LOOKUP, _head("ce")]}).endswith(
        "· head lookup (prompt lookup: no weights) · head ce (ce loss, trained depth 5, whole vocabulary)")
    old = {"policy_parameters": 134515008, "head": "e2e_tv"}  # before runs recorded them: a size, the spec alone
    assert (policy_of(old), head_of(old), policy_of({}), head_of({})) == ("—", "e2e_tv", "—", "—")
    assert made_by(old) == "policy — (134.5M parameters) · head e2e_tv" and made_by({}) == "policy —"


# ----------------------------------------------------------------------------------------- bebop rl: flags, line
def test_rl_takes_the_demos_size_flags_and_defaults_to_auto_gamma():
    import argparse

    from bebop.commands.rl import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(["--out", "x", "--prompts", "3", "--group", "5",
                                                 "--max-new-tokens", "40"]))
    assert (config.prompts_per_step, config.group_size, config.max_new_tokens, config.gamma) == (3, 5, 40, "auto")
    assert config_from_args(parser.parse_args(["--out", "x"])).prompts_per_step == 8  # the preset's when not given
    assert config_from_args(parser.parse_args(["--out", "x", "--gamma", "2"])).gamma == 2
    # vLLM fixes the depth at start: there the default is an int depth, and auto asked for is refused (below)
    assert config_from_args(parser.parse_args(["--out", "x", "--backend", "vllm"])).gamma == 3


@pytest.mark.parametrize("argv, expected", [
    (["--prompts", "0"], "--prompts must be a positive int, got 0"),
    (["--group", "1"], "--group must be an int >= 2, got 1"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be a positive int, got 0"),
    (["--backend", "vllm", "--gamma", "auto"], "with --backend 'vllm' give an int depth (--gamma 3, say)"),
])
def test_rl_size_and_depth_misuse_is_one_line_before_loading(monkeypatch, capsys, argv, expected):
    import bebop.commands.rl as rl

    monkeypatch.setattr(rl, "load_policy", lambda *a, **k: pytest.fail("a model was loaded before the flags"))
    assert main(["rl", "--out", "R", *argv]) == 2
    assert expected in one_error_line(capsys)
    assert not Path("R").exists()


CLOSING = re.compile(r"R: steps 0-1, reward \d\.\d{3} -> \d\.\d{3}, (.+), step time (\d+\.\d\d)s \(median\), (.+)")


@pytest.mark.parametrize("argv, decoding, made", [
    ([], r"accept length (\d\.\d\d) \(γ auto, mean (\d\.\d)\)", "policy default, head e2e_tv"),
    (["--gamma", "2"], r"accept length (\d\.\d\d) \(γ 2\)", "policy default, head e2e_tv"),
    (["--rollout", "none"], "plain decoding", "policy default"),
])
def test_rl_closes_with_accept_length_gamma_and_what_made_the_run(capsys, argv, decoding, made):
    assert main(["rl", *SMALL_RL, "--no-progress", "--out", "R", *argv]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("R: "))
    match = CLOSING.fullmatch(line)
    assert match and match.group(3) == made, line
    numbers = re.fullmatch(decoding, match.group(1))
    assert numbers, line
    records = [json.loads(row) for row in Path("R/train.jsonl").read_text().splitlines()]
    if numbers.groups():  # the numbers are the run's own, pooled over its steps
        assert float(numbers.group(1)) == pytest.approx(derive(pool(records))["spec/accept_length"], abs=0.005)
    if len(numbers.groups()) == 2:
        chosen = {int(k.rsplit("/", 1)[1]): sum(r[k] for r in records) for k in records[0]
                  if k.startswith("spec/num_gamma_chosen/")}
        mean = sum(g * n for g, n in chosen.items()) / sum(chosen.values())
        assert float(numbers.group(2)) == pytest.approx(mean, abs=0.05)
