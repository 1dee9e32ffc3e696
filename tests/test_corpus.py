"""train-mtp's corpus (bebop.heads.corpus): drafted by a head under RS, resumed after an interruption, its progress
told; and the prompt families made for it (code in three styles, chat), with their held-out splits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import bebop.heads.corpus as corpus
from bebop.data.tasks import get as get_task
from bebop.data.tasks.code_library import FUNCTIONS
from bebop.data.tasks.code_styles import HEADER, split_of, source
from bebop.data.tokenizer import CharTokenizer
from bebop.engine.lookup import PromptLookup
from bebop.heads.config import TrainMTPConfig
from bebop.heads.corpus import load_corpus
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    tokenizer = CharTokenizer()
    config = ModelConfig.tiny(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    return Transformer(config).eval(), tokenizer, MTPHead(config, trained_depth=2).eval()


def test_a_drafted_corpus_is_named_apart_and_needs_its_head(policy, tmp_path):
    model, tokenizer, head = policy
    plain = TrainMTPConfig.tiny()
    drafted = dataclasses.replace(plain, corpus_head="h", corpus_gamma=2)
    a = load_corpus(tmp_path, model, tokenizer, plain)
    b = load_corpus(tmp_path, model, tokenizer, drafted, drafter=head)
    assert len(list(tmp_path.glob("*.pt"))) == 2  # other samples of the same distribution: another file
    assert len(b["tokens"]) == len(a["tokens"]) and b["key"]["corpus_head"] == "h"
    for tokens, trainable in zip(b["tokens"], b["trainable"]):
        assert len(tokens) == len(trainable) and any(trainable)
    assert load_corpus(tmp_path, model, tokenizer, drafted, drafter=head) == b  # read back, seeded
    lookup = load_corpus(None, model, tokenizer, dataclasses.replace(drafted, corpus_head="lookup"),
                         drafter=PromptLookup())
    assert len(lookup["tokens"]) == plain.num_sequences
    with pytest.raises(ValueError, match="corpus_head is 'h' but a drafting head was not handed in"):
        load_corpus(tmp_path, model, tokenizer, drafted)
    with pytest.raises(ValueError, match="corpus_head is None but a drafting head was handed in"):
        load_corpus(tmp_path, model, tokenizer, plain, drafter=head)


def test_an_interrupted_generation_resumes_where_it_stopped(policy, tmp_path, monkeypatch):
    """Killed after its first engine call, a task's generation leaves that call's answers in its partial file; the
    next run generates only the rest, and the corpus is the one an uninterrupted run makes."""
    model, tokenizer, _ = policy
    config = dataclasses.replace(TrainMTPConfig.tiny(), num_sequences=6, corpus_rows=4)
    whole = load_corpus(None, model, tokenizer, config)
    calls, told = [], []
    real = corpus.complete

    def dies_after_one(*args, **kwargs):
        if calls:
            raise KeyboardInterrupt
        calls.append(len(args[3]))
        return real(*args, **kwargs)

    monkeypatch.setattr(corpus, "complete", dies_after_one)
    with pytest.raises(KeyboardInterrupt):
        load_corpus(tmp_path, model, tokenizer, config, log=told.append)
    assert calls == [4] and len(list(tmp_path.glob(".*.partial"))) == 1
    assert any("4/6 answers" in line and "min left" in line for line in told)
    monkeypatch.setattr(corpus, "complete", lambda *a, **k: calls.append(len(a[3])) or real(*a, **k))
    resumed = load_corpus(tmp_path, model, tokenizer, config, log=told.append)
    assert calls == [4, 2] and resumed["tokens"] == whole["tokens"] and resumed["trainable"] == whole["trainable"]
    assert not list(tmp_path.glob(".*.partial")) and len(list(tmp_path.glob("*.pt"))) == 1
    assert any("4 from an interrupted run" in line for line in told)


@pytest.mark.parametrize("style", ["doc", "prose", "fix"])
def test_code_styles_are_rewarded_by_their_tests_and_hold_functions_out(style):
    task = get_task(f"code_{style}")
    held = task.heldout()
    train_names = {e.meta["entry_point"] for e in task.sample(200, seed=0)}
    held_names = {e.meta["entry_point"] for e in held.sample(100, seed=0)}
    assert train_names and held_names and not train_names & held_names
    assert all(split_of(f) == "train" for f in FUNCTIONS if set(f.names) & train_names)
    examples = task.sample(4, seed=1)
    right, wrong = [], []
    for example in examples:
        function = next(f for f in FUNCTIONS if example.meta["entry_point"] in f.names)
        # the reference written out as a chat answer: a fenced definition; its consts are read back from the tests
        text = _reference_answer(function, example)
        right.append(text)
        wrong.append(f"```python\ndef {example.meta['entry_point']}(*args):\n    return None\n```")
    assert task.rewards(examples, right) == [1.0] * 4
    assert task.rewards(examples, wrong) == [0.0] * 4
    if style == "doc":
        assert examples[0].prompt.startswith(HEADER) and '>>> ' in examples[0].prompt
    if style == "fix":
        assert "has a bug" in examples[0].prompt and "```python" in examples[0].prompt


def _reference_answer(function, example) -> str:
    """The function's reference with the constants whose tests the example's row asserts (tried until they pass)."""
    from bebop.data.tasks.base import Rng
    from bebop.data.tasks.code_styles import run

    name = example.meta["entry_point"]
    for seed in range(2000):
        consts = function.consts(Rng.from_seed(seed))
        code = source(function, name, consts)
        scope: dict = {}
        exec(HEADER + example.meta["test"], scope)
        try:
            scope["check"](lambda *a: run(code, name, a))
        except AssertionError:
            continue
        return f"Here it is:\n```python\n{code}```\n"
    raise AssertionError(f"no constants of {name} pass its row's tests")


def test_chat_prompts_hold_templates_out_and_have_no_verifier():
    task = get_task("chat")
    train = {e.meta["template"] for e in task.sample(300, seed=0)}
    held = {e.meta["template"] for e in task.heldout().sample(100, seed=0)}
    assert train and held and not train & held
    example = task.sample(1, seed=3)[0]
    assert example.prompt.endswith("\n") and "{" not in example.prompt
    assert task.verifiable is False
    with pytest.raises(ValueError, match="no verifier"):
        task.reward(example, "hello")
