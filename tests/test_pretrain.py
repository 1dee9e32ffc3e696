"""`bebop pretrain` and its data: masks, batching, schedule, reproducibility, run directory, checkpoint."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

import bebop.commands.pretrain as pretrain_cmd
from bebop.pretrain import PretrainConfig, initial_model, lm_loss, lr_at, pretrain
from bebop.data.batches import DemoBatches, encode_demo, pad
from bebop.data.tasks import get as get_task
from bebop.data.tokenizer import CharTokenizer, load_tokenizer
from bebop.models.checkpoint import load_pretrained
from bebop.models.config import ModelConfig
from bebop.models.transformer import Transformer


@pytest.fixture(scope="module")
def tokenizer() -> CharTokenizer:
    return CharTokenizer()


def test_encode_demo_masks_prompt_and_tool_replies(tokenizer):
    task = get_task("agent")
    example = task.sample(1, seed=3, level=2)[0]
    solution = task.demonstration(example, torch.Generator().manual_seed(0))
    tokens, mask = encode_demo(tokenizer, example, solution)
    text = example.prompt + solution + "<eos>"
    assert tokenizer.decode(tokens) == text
    prompt_len = len(tokenizer.encode(example.prompt))
    assert not any(mask[:prompt_len]) and mask[-1]  # EOS is the policy's to write
    written = tokenizer.decode([t for t, m in zip(tokens, mask) if m])
    assert "<result>" not in written and "</result>" not in written
    assert "<call>lookup price" in written and written.endswith(f"answer: {example.answer}<eos>")


def test_prompt_loss_adds_the_prompt_but_never_tool_replies(tokenizer):
    task = get_task("agent")
    example = task.sample(1, seed=4, level=3)[0]
    solution = task.demonstration(example, torch.Generator().manual_seed(1))
    tokens, without = encode_demo(tokenizer, example, solution)
    same, with_prompt = encode_demo(tokenizer, example, solution, prompt_loss=True)
    prompt_len = len(tokenizer.encode(example.prompt))
    assert same == tokens and all(with_prompt[:prompt_len]) and with_prompt[prompt_len:] == without[prompt_len:]


def test_demo_batches_deterministic_mixed_and_masked(tokenizer):
    a = DemoBatches(("math", "code", "agent"), tokenizer, batch_size=6, error_rate=0.2, seed=1)
    b = DemoBatches(("math", "code", "agent"), tokenizer, batch_size=6, error_rate=0.2, seed=1)
    c = DemoBatches(("math", "code", "agent"), tokenizer, batch_size=6, error_rate=0.2, seed=2)
    texts, other = [], []
    for _ in range(4):
        (ta, ma), (tb, mb), (tc, _) = next(a), next(b), next(c)
        assert torch.equal(ta, tb) and torch.equal(ma, mb)
        assert ta.shape == ma.shape and ma.dtype == torch.bool
        texts += [tokenizer.decode(row.tolist()) for row in ta]
        other += [tokenizer.decode(row.tolist()) for row in tc]
    assert texts != other  # another seed, other data
    assert any("write f with" in t for t in texts) and any("<call>" in t for t in texts)
    assert any("how many" in t for t in texts)


def test_demo_batches_continue_from_their_state_as_if_never_stopped(tokenizer):
    """A stream restored from `state_dict` at any batch (mid-chunk or at a chunk's end) serves what the unbroken
    stream serves next."""
    settings = dict(batch_size=3, error_rate=0.2, seed=4, bucket=3)
    whole = DemoBatches(("math", "agent"), tokenizer, **settings)
    expected = [next(whole) for _ in range(8)]
    for served in (0, 2, 3, 5):
        cut = DemoBatches(("math", "agent"), tokenizer, **settings)
        for _ in range(served):
            next(cut)
        again = DemoBatches(("math", "agent"), tokenizer, **settings)
        again.load_state_dict(cut.state_dict())
        for want in expected[served:]:
            got = next(again)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), served


def test_lm_loss_is_masked_cross_entropy():
    torch.manual_seed(0)
    model = Transformer(PretrainConfig.tiny().model)
    tokens = torch.randint(0, 104, (2, 9))
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, 4:], mask[1, 2:6] = True, True
    logits, _ = model(tokens[:, :-1])
    ce = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    want = ce[mask[:, 1:]].mean()
    assert torch.allclose(lm_loss(model, tokens, mask, use_bf16=False), want, atol=1e-6)


def test_lr_schedule_warmup_then_cosine_to_min():
    config = dataclasses.replace(PretrainConfig(), steps=100, warmup=10, lr=1e-3, min_lr=1e-4)
    assert lr_at(0, config) == pytest.approx(1e-4)
    assert lr_at(9, config) == pytest.approx(1e-3)
    assert lr_at(99, config) == pytest.approx(1e-4)
    lrs = [lr_at(s, config) for s in range(10, 100)]
    assert all(x >= y for x, y in zip(lrs, lrs[1:]))


@pytest.mark.parametrize("field, value", [("tasks", ("math", "poetry")), ("error_rate", 1.5), ("steps", 0),
                                          ("dtype", "fp8"), ("warmup", 10_000)])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field.split("_")[0] if field != "tasks" else "poetry"):
        dataclasses.replace(PretrainConfig.tiny(), **{field: value})


def test_tiny_pretrain_is_reproducible_and_writes_run_and_checkpoint(tmp_path):
    config = dataclasses.replace(PretrainConfig.tiny(), steps=6, eval_every=3, lr=3e-3)
    a = pretrain(config, tmp_path / "run_a", tmp_path / "ckpt")
    b = pretrain(config, tmp_path / "run_b", None)
    other = pretrain(dataclasses.replace(config, seed=5), tmp_path / "run_c", None)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.state_dict().values(), other.state_dict().values()))
    meta = json.loads((tmp_path / "run_a" / "meta.json").read_text())
    assert meta["kind"] == "pretrain" and meta["config"]["steps"] == 6 and meta["config"]["error_rate"] == 0.15
    train = [json.loads(line) for line in (tmp_path / "run_a" / "train.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (tmp_path / "run_a" / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in train] == list(range(6)) and all(r["loss"] > 0 for r in train)
    assert [r["step"] for r in evals] == [2, 5]
    for key in ("reward/math", "reward/code", "reward/agent", "entropy/mean"):
        assert 0 <= evals[-1][key] and (key == "entropy/mean" or evals[-1][key] <= 1)
    assert json.loads((tmp_path / "run_a" / "status.json").read_text())["state"] == "finished"
    model, head = load_pretrained(tmp_path / "ckpt")
    assert head is None and model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert torch.equal(model.model.embed_tokens.weight, a.model.embed_tokens.weight.to(torch.bfloat16))
    assert isinstance(load_tokenizer(tmp_path / "ckpt"), CharTokenizer)


def test_command_runs_and_rejects_unknown_task(tmp_path):
    parser = argparse.ArgumentParser()
    pretrain_cmd.add_arguments(parser)
    args = parser.parse_args(["--tiny", "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    assert pretrain_cmd.run(args) == 0
    assert (tmp_path / "out" / "config.json").is_file() and (tmp_path / "out" / "tokenizer.json").is_file()
    bad = parser.parse_args(["--tiny", "--tasks", "math", "chess", "--run-dir", str(tmp_path / "bad")])
    with pytest.raises(ValueError, match="chess"):
        pretrain_cmd.run(bad)


def test_pad_rejects_empty():
    with pytest.raises(ValueError):
        pad([[1, 2], []], 0)
    tokens, lengths = pad([[1, 2, 3], [4]], 0)
    assert tokens.tolist() == [[1, 2, 3], [4, 0, 0]] and lengths.tolist() == [3, 1]


def test_model_vocab_must_match_tokenizer(tmp_path):
    config = dataclasses.replace(PretrainConfig.tiny(), model=ModelConfig.tiny(vocab_size=50, hidden_size=32,
                                 intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1, head_dim=16))
    with pytest.raises(ValueError, match="vocab"):
        pretrain(config, tmp_path / "run", None)


def test_init_continues_from_a_checkpoint(tmp_path, tokenizer):
    config = PretrainConfig.tiny()
    first = pretrain(config, tmp_path / "a", tmp_path / "ckpt")
    model = initial_model(dataclasses.replace(config, init=str(tmp_path / "ckpt")), tokenizer)
    assert model.training and model.model.embed_tokens.weight.dtype == torch.float32
    assert torch.equal(model.model.embed_tokens.weight, first.model.embed_tokens.weight.to(torch.bfloat16).float())
    with pytest.raises(FileNotFoundError):
        initial_model(dataclasses.replace(config, init=str(tmp_path / "nope")), tokenizer)


def test_an_interrupted_pretrain_resumes_to_the_run_never_stopped(tmp_path, monkeypatch, capsys):
    """Ctrl-C at step 6 of 8 (checkpoints after steps 3 and 7, evals after 2, 5 and 7): the job prints the command
    that resumes it, and that command rewinds the logs to the checkpoint and writes the same streams (timing aside)
    and the same policy as a run never stopped."""
    import bebop.pretrain
    from bebop.cli import main

    argv = ["pretrain", "--tiny", "--steps", "8", "--eval-every", "3", "--checkpoint-every", "4", "--device", "cpu",
            "--dtype", "fp32"]
    assert main([*argv, "--run-dir", str(tmp_path / "whole"), "--out", str(tmp_path / "whole-policy")]) == 0
    step, calls = bebop.pretrain.train_step, []

    def stopped_at_step_6(*args):
        calls.append(1)
        if len(calls) == 7:
            raise KeyboardInterrupt
        return step(*args)

    monkeypatch.setattr(bebop.pretrain, "train_step", stopped_at_step_6)
    assert main([*argv, "--run-dir", str(tmp_path / "cut"), "--out", str(tmp_path / "cut-policy")]) == 130
    assert json.loads((tmp_path / "cut" / "status.json").read_text())["state"] == "interrupted"
    logged = [json.loads(line)["step"] for line in (tmp_path / "cut" / "train.jsonl").read_text().splitlines()]
    assert logged == list(range(6))  # steps 4 and 5 were logged after the last checkpoint (step 3)
    command = capsys.readouterr().err.strip().splitlines()[-1].split()
    assert command[:2] == ["bebop", "pretrain"] and command[-1] == "--resume"
    monkeypatch.setattr(bebop.pretrain, "train_step", step)
    assert main(command[1:]) == 0  # --out holds the policy this run saved at step 5: its own, no --force
    for stream in ("train", "eval"):
        whole, cut = ([{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
                       for line in (tmp_path / run / f"{stream}.jsonl").read_text().splitlines()]
                      for run in ("whole", "cut"))
        assert whole == cut, stream
    whole, cut = load_pretrained(tmp_path / "whole-policy")[0], load_pretrained(tmp_path / "cut-policy")[0]
    for (name, a), b in zip(whole.state_dict().items(), cut.state_dict().values()):
        assert torch.equal(a, b), name
    meta = json.loads((tmp_path / "cut" / "meta.json").read_text())
    assert len(meta["resumes"]) == 1 and meta["out"] == str((tmp_path / "cut-policy").resolve())


def test_a_resumed_pretrain_refuses_a_changed_setting_naming_its_flag(tmp_path, capsys):
    from bebop.cli import main

    argv = ["pretrain", "--tiny", "--steps", "2", "--device", "cpu", "--dtype", "fp32", "--run-dir", str(tmp_path / "r")]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, "--resume", "--lr", "0.5"]) == 2
    line = capsys.readouterr().err.strip()
    assert f"cannot resume --run-dir {tmp_path / 'r'} with --lr 0.5: it was recorded with --lr 0.003" in line, line
    assert main([*argv, "--resume", "--steps", "3"]) == 0  # --steps may change: step 2 runs, after the end's checkpoint
    assert "resuming --run-dir" in capsys.readouterr().err
    logged = [json.loads(line)["step"] for line in (tmp_path / "r" / "train.jsonl").read_text().splitlines()]
    assert logged == [0, 1, 2]
