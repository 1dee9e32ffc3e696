"""train-mtp's corpus (bebop.heads.corpus): drafted by a head under RS, resumed after an interruption, its progress
told; and the prompt families made for it (code in three styles, chat), with their held-out splits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import bebop.heads.corpus as corpus
from bebop.data.tasks import Example, Task
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


class _OnePrompt(Task):
    """One prompt, asked `n` times: its answers are n draws from one law the test computes exactly (handed in for
    "math", a name the config accepts)."""

    name, levels = "one", (1,)

    def sample(self, n: int, seed: int, *, level: int | None = None) -> list[Example]:
        return [Example(prompt="7+8=", answer=15, level=1, task=self.name)] * n

    def reward(self, example: Example, completion: str) -> float:
        return 0.0

    def _demonstrate(self, example: Example, rng, wrong: bool) -> str:
        raise NotImplementedError


def _first_two_laws(model, tokenizer, prompt: list[int], temperature: float, head: MTPHead | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's exact law of an answer's first token [V], and of its second [V + 1] (the last cell: no second
    token, the first having been the stop); with `head`, the second is drawn from the head's draft instead (the
    first is always the policy's: the prefill's sample, before anything is drafted)."""
    vocab = model.config.vocab_size
    with torch.no_grad():
        logits, _ = model(torch.tensor([prompt]))
        first = torch.softmax(logits[0, -1].double() / temperature, -1)  # [V]
        tokens = torch.tensor([prompt + [t] for t in range(vocab)])  # [V, T + 1]
        after, hidden = model(tokens)  # [V, T + 1, V], [V, T + 1, d]
        if head is not None:  # the draft of the token after t1, read at the prompt's last position
            after = head.chain(model, hidden, tokens, 1)[:, :, 0]  # [V, T + 1, V]
        given = torch.softmax(after[:, len(prompt) - (head is not None)].double() / temperature, -1)  # [V, V]
    go_on = first.clone()
    go_on[tokenizer.eos_id] = 0.0
    return first, torch.cat([go_on @ given, first[tokenizer.eos_id].reshape(1)])  # [V], [V + 1]


def _p_value(counts: torch.Tensor, law: torch.Tensor) -> float:
    """Pearson's χ² goodness of fit, the cells expecting fewer than 5 draws pooled into one."""
    from scipy.stats import chisquare

    expected = law * counts.sum()
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    expected = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    return float(chisquare(observed.numpy(), expected.numpy() * observed.sum().item() / expected.sum().item()).pvalue)


def test_a_corpus_drafted_by_a_head_is_the_policy_s_own_distribution(tmp_path):
    """RS is exact, so the answers a drafting head helps write are draws from the policy itself: the first two tokens
    of 3,000 drafted answers fit the policy's exact laws (χ², p > 1e-3), and the same counts reject the law the head
    drafts the second token from (the test can fail: verification that let drafts through unchecked would fit it)."""
    torch.manual_seed(1)
    tokenizer = CharTokenizer()
    config = ModelConfig.tiny(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model, head = Transformer(config).eval(), MTPHead(config, trained_depth=2).eval()
    with torch.no_grad():  # peaked laws: a few tokens carry most of the mass, so a wrong law shows in the counts
        model.lm_head.weight.mul_(8.0)
    train = dataclasses.replace(TrainMTPConfig.tiny(), tasks=("math",), num_sequences=3000, max_new_tokens=3,
                                temperature=0.7, corpus_head="h", corpus_gamma=2, corpus_rows=500)
    answers = load_corpus(None, model, tokenizer, train, {"math": _OnePrompt()}, drafter=head)
    prompt = tokenizer.encode("7+8=")
    vocab, stop = config.vocab_size, tokenizer.eos_id
    counts = [torch.zeros(vocab, dtype=torch.float64), torch.zeros(vocab + 1, dtype=torch.float64)]
    for tokens in answers["tokens"]:
        first, *rest = tokens[len(prompt):]
        counts[0][first] += 1
        counts[1][rest[0] if first != stop else vocab] += 1
    laws = _first_two_laws(model, tokenizer, prompt, 0.7)
    assert all(_p_value(c, law) > 1e-3 for c, law in zip(counts, laws))
    drafted = _first_two_laws(model, tokenizer, prompt, 0.7, head)[1]
    assert 0.5 * float((drafted - laws[1]).abs().sum()) > 0.2  # the head alone would write other answers
    assert _p_value(counts[1], drafted) < 1e-3  # and these counts would show it
