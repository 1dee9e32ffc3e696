"""A user's own model, end to end: a checkpoint made by `bebop make-checkpoint` (a transformers Qwen3 with a byte-level
BPE ChatML tokenizer, padded embedding rows and a multi-token "</call>") through train-mtp, eval-mtp and rl on the
shipped GSM8K-format sample, exactly as the README's "Your own model" runs them; and the rewards of planted
completions that end in the tokenizer's real EOS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bebop.cli import main
from bebop.data import tasks
from bebop.data.tasks import dataset
from bebop.data.tokenizer import load_tokenizer
from bebop.engine import GenerationConfig
from bebop.engine.stops import StopMatcher, text_before
from bebop.play import for_task
from bebop.runlog import list_runs, load_run

SAMPLE = Path(__file__).resolve().parents[1] / "bebop" / "assets" / "data" / "gsm8k_sample.jsonl"
DATA = f"jsonl:{SAMPLE}"


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("own") / "my-qwen3"
    assert main(["make-checkpoint", str(out), "--family", "qwen3"]) == 0
    return out


@pytest.fixture(scope="module")
def dataset_reads() -> dict[str, list[str]]:
    """The dataset specs each command of `pipeline` read from disk, in order (filled by `pipeline`)."""
    return {}


@pytest.fixture(scope="module")
def pipeline(policy, tmp_path_factory, dataset_reads) -> Path:
    """The README's three commands, at the smallest settings that still exercise every path."""
    runs = tmp_path_factory.mktemp("runs")
    commands = {
        "train-mtp": ["train-mtp", "--policy", str(policy), "--tasks", DATA, "agent", "--num-sequences", "8",
                      "--max-new-tokens", "24", "--steps", "4", "--batch-size", "4", "--eval-every", "2", "--depth",
                      "3", "--out", str(policy / "heads" / "mine"), "--run-dir", str(runs / "train")],
        "eval-mtp": ["eval-mtp", "--policy", str(policy), "--heads", "mine", "--tasks", DATA, "--temperatures", "1.0",
                     "--num-prompts", "4", "--max-new-tokens", "24", "--run-dir", str(runs / "eval")],
        "rl": ["rl", "--policy", str(policy), "--head", "mine", "--task", DATA, "--steps", "2",
               "--out", str(runs / "rl"), "--no-progress"],
    }
    read = dataset.read_rows
    for name, argv in commands.items():
        seen = dataset_reads.setdefault(name, [])
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(dataset, "read_rows", lambda spec, config: seen.append(spec) or read(spec, config))
            assert main(argv) == 0
    return runs


def test_each_command_reads_its_dataset_once(pipeline, dataset_reads):
    """Configs check task names only; the command builds its tasks once, before the policy loads, and hands them on."""
    assert dataset_reads == {"train-mtp": [DATA], "eval-mtp": [DATA], "rl": [DATA]}


def test_the_pipeline_runs_on_a_users_checkpoint_and_writes_runs_the_dashboard_reads(pipeline, policy):
    assert {info.path.name for info in list_runs(pipeline)} == {"train", "eval", "rl"}
    rl = load_run(pipeline / "rl")
    assert list(rl.streams["train"]["step"]) == [0, 1]
    assert rl.meta["config"]["task"] == DATA and rl.meta["config"]["chat_template"] == "auto"
    assert len(rl.streams["samples"]) > 0
    eval_rows = json.loads((pipeline / "eval" / "table.json").read_text())
    assert {row["method"] for row in eval_rows} == {"to", "rs"} and all(row["num_draft_tokens"] > 0 for row in eval_rows)
    assert (policy / "heads" / "mine" / "head.json").is_file()


def _planted(tokenizer, task, text: str) -> str:
    """What a reward sees for a completion that wrote `text` and then the tokenizer's real EOS."""
    config = for_task(GenerationConfig(max_new_tokens=64), task, tokenizer, model_vocab=tokenizer.vocab_size + 64)
    tokens = tokenizer.encode(text) + [tokenizer.eos_id]
    stop_at, stop = StopMatcher(config.stop_tokens, config.stop_strings, tokenizer.decode).first([], tokens)
    assert stop_at == len(tokens) - 1
    return text_before(tokenizer.decode, tokens, stop)


def test_planted_completions_ending_in_the_real_eos_are_scored_right(policy):
    tokenizer = load_tokenizer(policy)
    assert tokenizer.decode([tokenizer.eos_id]) == "<|im_end|>"
    gsm8k = tasks.get(DATA)
    example = gsm8k.sample(1, seed=0)[0]
    gold = example.answer.split("####")[-1].strip()
    for right in (f"So the answer is {gold}.", f"The total is \\boxed{{{gold}}}"):
        assert gsm8k.reward(example, _planted(tokenizer, gsm8k, right)) == 1.0
    assert gsm8k.reward(example, _planted(tokenizer, gsm8k, f"So the answer is {int(gold) + 1}.")) == 0.0

    code = tasks.get("code")
    example = code.sample(1, seed=0)[0]
    right = code.demonstration(example, torch.Generator().manual_seed(0))
    wrong = code.demonstration(example, torch.Generator().manual_seed(0), error_rate=1.0)
    assert code.reward(example, _planted(tokenizer, code, right)) == 1.0
    assert code.reward(example, _planted(tokenizer, code, wrong)) == 0.0

    math = tasks.get("math")
    example = math.sample(1, seed=0)[0]
    assert math.reward(example, _planted(tokenizer, math, f"answer: {example.answer}")) == 1.0
    assert math.reward(example, _planted(tokenizer, math, f"answer: {example.answer + 1}")) == 0.0


@pytest.mark.parametrize("break_it, message", [
    ("tokenizer", "has no tokenizer"),
    ("family", "model_type='gpt2'"),
    ("key", "has no prompt column 'problem'"),
])
def test_misuse_of_a_users_model_is_one_line_and_exit_2(policy, tmp_path, capsys, break_it, message):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "model.safetensors", *(() if break_it == "tokenizer" else
                                                        ("tokenizer.json", "tokenizer_config.json"))):
        (broken / name).write_bytes((policy / name).read_bytes())
    if break_it == "family":
        config = json.loads((broken / "config.json").read_text())
        (broken / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    args = ["eval-mtp", "--policy", str(broken), "--heads", "embedded", "--tasks", DATA, "--num-prompts", "1"]
    if break_it == "key":
        args += ["--prompt-key", "problem"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err
