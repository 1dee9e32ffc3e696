"""`bebop train-mtp`: frozen backbone, self-generated data, logged metrics, data cache, bad input."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import torch

import bebop.commands.train_mtp as train_mtp_cmd
import bebop.heads.corpus as corpus
import bebop.heads.step as heads_step
from bebop.data.tasks import get as get_task
from bebop.data.tokenizer import CharTokenizer
from bebop.heads.config import TrainMTPConfig
from bebop.heads.corpus import CorpusSource
from bebop.heads.corpus import DATA_SEED, load_corpus
from bebop.heads.data import anchor_mask
from bebop.heads.train import load_frozen_policy, open_run, train_mtp
from bebop.losses import OBJECTIVES
from bebop.models.checkpoint import load_head, save_head, save_pretrained
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer
from bebop.policy import load_policy

TINY_MODEL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16)


@pytest.fixture(scope="module")
def policy() -> tuple[Transformer, CharTokenizer]:
    torch.manual_seed(0)
    tokenizer = CharTokenizer()
    return Transformer(ModelConfig.tiny(vocab_size=tokenizer.vocab_size, **TINY_MODEL)).eval(), tokenizer


def read_stream(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("objective", ["ce", "e2e_tv"])
def test_only_the_head_changes_and_metrics_are_logged(policy, tmp_path, objective):
    model, tokenizer = policy
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = TrainMTPConfig.tiny(objective)
    head = train_mtp(model, tokenizer, config, tmp_path / "run", data=CorpusSource(tmp_path / "data"),
                     out=tmp_path / "head")
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "the backbone must stay bit-identical"
    torch.manual_seed(config.seed)
    init = heads_step.new_head(model, config)
    changed = [k for k, v in head.state_dict().items() if not torch.equal(v, init.state_dict()[k])]
    assert "fc.weight" in changed and any(k.startswith("layers.0.") for k in changed)
    train = read_stream(tmp_path / "run" / "train.jsonl")
    assert [r["step"] for r in train] == list(range(config.steps))
    assert all(f"mtp/loss/{objective}" in r and 0 <= r["mtp/d_tv_mean"] <= 1 for r in train)
    assert all(r["mtp/grad_norm"] > 0 for r in train)  # before clipping, so it shows how often the clip acts
    evals = read_stream(tmp_path / "run" / "eval.jsonl")
    assert evals and 1 <= evals[-1]["mtp/eval/accept_length_tf"] <= 1 + min(3, config.depth)
    saved = load_head(tmp_path / "head", model.config)
    assert saved.objective == objective and saved.trained_depth == config.depth
    assert torch.equal(saved.fc.weight, head.fc.weight.to(torch.bfloat16))
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["kind"] == "train-mtp" and meta["config"]["objective"] == objective
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "finished" and status["message"].startswith("training the head"), status


def test_seeded_training_is_reproducible(policy, tmp_path):
    model, tokenizer = policy
    config = TrainMTPConfig.tiny("tv")
    a = train_mtp(model, tokenizer, config, tmp_path / "a", data=CorpusSource(tmp_path / "d"))
    b = train_mtp(model, tokenizer, config, tmp_path / "b", data=CorpusSource(tmp_path / "d"))
    c = train_mtp(model, tokenizer, dataclasses.replace(config, seed=1), tmp_path / "c")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.fc.weight, c.fc.weight)


def test_the_steps_hand_their_freed_memory_back_every_release_every_steps(policy, tmp_path, monkeypatch):
    """Once before the first step (what generating the corpus and the backbone's pass freed) and after every
    RELEASE_EVERY-th step, its batch dropped, the freed blocks go back to the OS (bebop.host_memory): without it a
    long run's resident memory climbs with the steps (docs/real-model.md)."""
    import bebop.heads.train as heads_train

    model, tokenizer = policy
    config = dataclasses.replace(TrainMTPConfig.tiny("tv"), steps=7)
    events = []
    monkeypatch.setattr(heads_train, "RELEASE_EVERY", 3)
    monkeypatch.setattr(heads_train, "release_freed_memory", lambda: events.append("release"))
    real_step = heads_train.train_step
    monkeypatch.setattr(heads_train, "train_step", lambda *a, **k: (events.append("step"), real_step(*a, **k))[1])
    train_mtp(model, tokenizer, config, tmp_path / "a", data=CorpusSource(tmp_path / "d"))
    assert events == ["release"] + ["step"] * 3 + ["release"] + ["step"] * 3 + ["release"] + ["step"]


def test_runs_sharing_batches_run_the_backbone_once_and_train_as_alone(policy, tmp_path, monkeypatch):
    """train_mtp(data=CorpusSource(cache, shared)): heads trained with several objectives on one corpus (notebook 03's five losses) compute
    the backbone's batches once, and each head is bit-identical to the one trained alone, on the batches that pass
    left in the corpus directory; other batch settings make batches of their own. With a draft vocabulary, each run's S is chosen from the shared batches."""
    import bebop.heads.train as heads_train

    model, tokenizer = policy
    made = []
    real = heads_train.make_batches
    monkeypatch.setattr(heads_train, "make_batches", lambda *a, **k: made.append(a[2].objective) or real(*a, **k))
    config = dataclasses.replace(TrainMTPConfig.tiny(), draft_vocab=24)
    shared: dict = {}
    heads = {objective: train_mtp(model, tokenizer, dataclasses.replace(config, objective=objective),
                                  tmp_path / objective, data=CorpusSource(tmp_path / "d", shared))
             for objective in ("ce", "tv", "e2e_tv")}
    assert made == ["ce"] and len(shared) == 1
    for objective, head in heads.items():
        alone = train_mtp(model, tokenizer, dataclasses.replace(config, objective=objective), tmp_path / f"{objective}-1",
                          data=CorpusSource(tmp_path / "d"))
        assert all(torch.equal(x, y) for x, y in zip(head.state_dict().values(), alone.state_dict().values()))
        assert torch.equal(head.draft_ids, alone.draft_ids)
    train_mtp(model, tokenizer, dataclasses.replace(config, batch_size=2), tmp_path / "b2", data=CorpusSource(tmp_path / "d", shared))
    # the runs alone read the backbone's pass the first run kept beside the corpus; another batch size makes its own
    assert made == ["ce", "e2e_tv"] and len(shared) == 2
    assert len(list((tmp_path / "d").glob("features-*"))) == 2


def test_self_generated_data_is_policy_samples(policy):
    model, tokenizer = policy
    config = TrainMTPConfig.tiny()
    data = load_corpus(None, model, tokenizer, config)
    assert len(data["tokens"]) == config.num_sequences
    assert data["key"] == {**config.data_key(), "policy": corpus.fingerprint(model)}
    prompts = {e.prompt for e in get_task("math").sample(config.num_sequences, seed=DATA_SEED + config.seed)}
    for tokens, trainable in zip(data["tokens"], data["trainable"]):
        assert len(tokens) == len(trainable)
        first = trainable.index(True)
        assert tokenizer.decode(tokens[:first]) in prompts and all(trainable[first:])
    assert load_corpus(None, model, tokenizer, config) == data  # seeded sampling


def test_the_corpus_cache_is_reused_only_by_the_same_policy_and_settings(policy, tmp_path, monkeypatch):
    model, tokenizer = policy
    config = TrainMTPConfig.tiny()
    first = load_corpus(tmp_path / "d", model, tokenizer, config)
    assert len(list((tmp_path / "d").glob("*.pt"))) == 1
    generated = []
    real = corpus.generate_task
    monkeypatch.setattr(corpus, "generate_task", lambda *a, **k: generated.append(a[3].name) or real(*a, **k))
    assert load_corpus(tmp_path / "d", model, tokenizer, config) == first and not generated  # read back
    hotter = dataclasses.replace(config, temperature=1.3)
    assert load_corpus(tmp_path / "d", model, tokenizer, hotter)["key"]["temperature"] == 1.3
    torch.manual_seed(1)
    another = Transformer(model.config).eval()  # same settings, another policy: its samples would differ
    load_corpus(tmp_path / "d", another, tokenizer, config)
    assert generated == ["math", "math"] and len(list((tmp_path / "d").glob("*.pt"))) == 3


def test_anchor_mask_keeps_chains_inside_policy_text():
    trainable = torch.tensor([[False, False, True, True, True, True, True, False],
                              [False, True, True, True, True, True, True, True]])
    lengths = torch.tensor([7, 8])
    mask = anchor_mask(trainable, lengths, depth=2)  # anchor t needs t+1..t+3 written and t+3 < length
    assert mask.tolist() == [[False, True, True, True, False, False, False, False],
                             [True, True, True, True, True, False, False, False]]


@pytest.mark.parametrize("changes, match", [({"objective": "mse"}, "mse"), ({"tasks": ("math", "go")}, "go"),
                                            ({"depth": 0}, "depth"), ({"temperature": 0.0}, "temperature"),
                                            ({"grad_clip": 0.0}, "grad_clip"), ({"dtype": "fp8"}, "dtype")])
def test_config_rejects_bad_values(changes, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(TrainMTPConfig.tiny(), **changes)
    assert set(OBJECTIVES) == {"ce", "kl", "rkl", "tv", "e2e_tv"}


def test_command_errors_and_runs(policy, tmp_path):
    model, tokenizer = policy
    parser = argparse.ArgumentParser()
    train_mtp_cmd.add_arguments(parser)
    with pytest.raises(FileNotFoundError):
        train_mtp_cmd.run(parser.parse_args(["--tiny", "--policy", str(tmp_path / "nope")]))
    with pytest.raises(ValueError, match="huber"):
        train_mtp_cmd.run(parser.parse_args(["--tiny", "--objective", "huber"]))
    save_pretrained(model, tmp_path / "policy")
    tokenizer.save(tmp_path / "policy")
    args = parser.parse_args(["--tiny", "--objective", "kl", "--policy", str(tmp_path / "policy"),
                              "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "head")])
    assert train_mtp_cmd.run(args) == 0
    assert load_head(tmp_path / "head", model.config).objective == "kl"


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_one_policy_loader_for_every_job(policy, tmp_path):
    """rl, train-mtp and eval-mtp load through bebop.policy: a head by name (the policy's heads/NAME, else the head
    its checkpoint stores) or by directory, and one clear error for anything else."""
    model, tokenizer = policy
    head = MTPHead(model.config, objective="ce")
    for name, stored in (("bare", None), ("full", head)):
        save_pretrained(model, tmp_path / name, mtp=stored)
        tokenizer.save(tmp_path / name)
    save_head(head, tmp_path / "bare" / "heads" / "e2e_tv")
    loaded, loaded_tokenizer, none = load_policy(tmp_path / "bare")
    assert none is None and _same_weights(loaded, model) and loaded_tokenizer.encode("1+2") == tokenizer.encode("1+2")
    for where, spec in (("bare", "e2e_tv"), ("full", "ce"), ("full", str(tmp_path / "bare" / "heads" / "e2e_tv"))):
        assert _same_weights(load_policy(tmp_path / where, spec)[2], head), (where, spec)
    with pytest.raises(FileNotFoundError, match="--policy"):
        load_policy(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"head 'tv' is neither a directory nor a head of .*\(\['e2e_tv'\]\)"):
        load_policy(tmp_path / "bare", "tv")
    with pytest.raises(FileNotFoundError, match=r"head 'nope' is neither .*\['ce', 'e2e_tv'"):
        load_policy(None, "nope")  # the embedded default's shipped heads
    fp32, _ = load_frozen_policy(None)  # train-mtp's view: the default in float32
    assert fp32.lm_head.weight.dtype == torch.float32


def test_command_flags_reach_the_config():
    parser = argparse.ArgumentParser()
    train_mtp_cmd.add_arguments(parser)
    config = train_mtp_cmd.config_from_args(parser.parse_args(
        ["--grad-clip", "0.5", "--autocast", "fp32", "--warmup-frac", "0.1", "--eval-every", "7", "--init", "h"]))
    assert (config.grad_clip, config.dtype, config.warmup_frac, config.eval_every, config.init_head) == (
        0.5, "fp32", 0.1, 7, "h")
    with pytest.raises(ValueError, match="grad_clip"):
        train_mtp_cmd.config_from_args(parser.parse_args(["--grad-clip", "0"]))


def test_a_head_over_a_draft_vocabulary_trains_saves_and_resumes_it(policy, tmp_path):
    """--draft-vocab K: S is the K ids with the most of the policy's probability on the training split, the stop id
    always among them; held-out coverage p(S) bounds the held-out acceptance; the head saved and the run resumed keep
    the same S; an adaptation keeps its init's S and refuses another size."""
    model, tokenizer = policy
    config = dataclasses.replace(TrainMTPConfig.tiny("e2e_tv"), draft_vocab=24, checkpoint_every=2)
    head = train_mtp(model, tokenizer, config, tmp_path / "run", data=CorpusSource(tmp_path / "d"), out=tmp_path / "h")
    assert head.draft_size == 24 and tokenizer.eos_id in head.draft_ids.tolist()
    evals = read_stream(tmp_path / "run" / "eval.jsonl")
    assert all(0 < r["mtp/eval/coverage"] <= 1 and 1 - r["mtp/eval/d_tv_pos/0"] <= r["mtp/eval/coverage"] + 1e-6
               for r in evals)
    assert torch.equal(load_head(tmp_path / "h", model.config).draft_ids, head.draft_ids)
    longer = dataclasses.replace(config, steps=config.steps + 2)
    resumed = train_mtp(model, tokenizer, longer, open_run(tmp_path / "run", longer, resume=True),
                        data=CorpusSource(tmp_path / "d"))
    assert torch.equal(resumed.draft_ids, head.draft_ids)
    adapted = train_mtp(model, tokenizer, dataclasses.replace(TrainMTPConfig.tiny("ce"), init_head=str(tmp_path / "h")),
                        tmp_path / "ce", data=CorpusSource(tmp_path / "d"))
    assert torch.equal(adapted.draft_ids, head.draft_ids)
    with pytest.raises(ValueError, match="drafts over 24 ids, not --draft-vocab 30"):
        train_mtp(model, tokenizer, dataclasses.replace(config, init_head=str(tmp_path / "h"), draft_vocab=30),
                  tmp_path / "x", data=CorpusSource(tmp_path / "d"))


def test_learning_rate_schedules():
    from bebop.heads.config import learning_rate

    constant = TrainMTPConfig(steps=100, warmup_frac=0.1)
    cosine = TrainMTPConfig(steps=100, warmup_frac=0.1, lr_schedule="cosine")
    for config in (constant, cosine):  # the same linear warmup to the peak
        assert [learning_rate(config, s) for s in (0, 4, 9)] == pytest.approx([1e-4, 5e-4, 1e-3])
    assert {learning_rate(constant, s) for s in range(9, 100)} == {1e-3}
    decay = [learning_rate(cosine, s) for s in range(9, 100)]
    assert all(a > b for a, b in zip(decay[1:], decay[2:]))  # falls at every step after the peak
    assert decay[-1] == pytest.approx(0.0, abs=1e-12) and learning_rate(cosine, 54) == pytest.approx(5e-4, rel=0.02)
    with pytest.raises(ValueError, match="lr_schedule"):
        TrainMTPConfig(lr_schedule="linear")
