"""Chat templates: --chat-template on|off|auto, the system/user layout, and a math reward through the template with
the tokenizer's real EOS (<|im_end|>)."""

from __future__ import annotations

import argparse

import pytest
import torch
from real_tokenizer import chain, make_bpe_tokenizer, steered_pair

from bebop.commands.prompt_args import add_prompt_args, prompt_fields
from bebop.data import tasks
from bebop.data.tokenizer import CharTokenizer, load_tokenizer
from bebop.engine import Engine, GenerationConfig
from bebop.data.prompts import PromptFormat, PromptOptions, job_prompt_format, prompt_format, prompt_ids
from bebop.rl.batch import Rollouts

IM_START = "<|im_start|>"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(make_bpe_tokenizer(tmp_path_factory.mktemp("chat")))


@pytest.fixture(scope="module")
def plain_tok(tmp_path_factory):
    return load_tokenizer(make_bpe_tokenizer(tmp_path_factory.mktemp("plain"), chat_template=False))


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_prompt_args(parser)
    return parser.parse_args(list(argv))


def resolve(args: argparse.Namespace, tokenizer) -> PromptFormat:
    """The prompt format the parsed flags ask for, as a job resolves its config's fields once the tokenizer loads."""
    return job_prompt_format(PromptOptions(**prompt_fields(args)), tokenizer)


def test_modes(tok, plain_tok):
    assert resolve(_parse(), tok) == PromptFormat(chat_template=True)  # auto, with a template
    assert resolve(_parse(), plain_tok) == PromptFormat(chat_template=False)
    assert resolve(_parse(), CharTokenizer()) == PromptFormat(chat_template=False)
    assert resolve(_parse("--chat-template", "off"), tok) == PromptFormat(chat_template=False)
    assert resolve(_parse("--chat-template", "on", "--system-prompt", "be brief"), tok).system == "be brief"
    for tokenizer in (plain_tok, CharTokenizer()):
        with pytest.raises(ValueError, match="has no chat template"):
            resolve(_parse("--chat-template", "on"), tokenizer)
    with pytest.raises(ValueError, match="system-prompt"):
        resolve(_parse("--chat-template", "off", "--system-prompt", "x"), tok)
    with pytest.raises(ValueError, match="chat-template"):
        prompt_format("yes", tok)
    with pytest.raises(SystemExit):
        _parse("--chat-template", "maybe")


def test_prompts_in_the_system_user_layout(tok):
    example = tasks.get("math").sample(1, seed=0)[0]
    raw, = prompt_ids(tok, [example], PromptFormat())
    assert raw == tok.encode(example.prompt)
    chat, = prompt_ids(tok, [example], PromptFormat(chat_template=True))
    assert tok.decode(chat) == f"{IM_START}user\n{example.prompt}<|im_end|>\n{IM_START}assistant\n"
    assert chat[0] == tok.encode(IM_START)[0] and len(tok.encode(IM_START)) == 1  # the special stays one token
    system, = prompt_ids(tok, [example], PromptFormat(chat_template=True, system="be brief"))
    assert tok.decode(system).startswith(f"{IM_START}system\nbe brief<|im_end|>\n{IM_START}user\n")
    with pytest.raises(ValueError, match="system"):
        PromptFormat(system="be brief")


@pytest.mark.parametrize("right", [True, False])
def test_a_math_answer_ending_in_im_end_is_scored(tok, right):
    task = tasks.get("math")
    examples = task.sample(2, seed=3)
    fmt = PromptFormat(chat_template=True)
    prompts = prompt_ids(tok, examples, fmt)
    start = prompts[0][-1]
    assert all(p[-1] == start for p in prompts)  # every chat prompt ends "assistant\n"
    answer = examples[0].answer if right else examples[0].answer + 1
    ids = tok.encode(f"answer: {answer}")
    model, head = steered_pair(tok.vocab_size, chain(start, ids, tok.eos_id))
    batch = Rollouts(Engine(model, head), task, tok, fmt).collect(examples[:1] * 2,
                                                                  GenerationConfig(max_new_tokens=12, gamma=2, seed=0))
    assert batch.prompts[0] == prompts[0]
    assert batch.rollout.tokens[0] == ids + [tok.eos_id]  # the engine stopped on <|im_end|>, kept in the tokens
    assert batch.completions[0] == f"answer: {answer}"  # ... and the reward read the text without it
    assert batch.rewards.tolist() == [float(right)] * 2


def test_notebook_positions_use_the_prompts_eval_mtp_uses(tok):
    """policy_positions (notebooks 01 and 02's exact acceptances) formats prompts as the jobs do: in the chat template
    when the tokenizer has one, so its positions are the ones the engine's sweep measures beside them."""
    from bebop.heads.positions import policy_positions
    from bebop.models.config import ModelConfig
    from bebop.models.mtp import MTPHead
    from bebop.models.transformer import Transformer

    torch.manual_seed(0)
    config = ModelConfig.tiny(tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model, heads = Transformer(config).eval(), {"h": MTPHead(config).eval()}
    task, examples = tasks.get("math"), tasks.get("math").sample(2, seed=0)
    answers = GenerationConfig(max_new_tokens=4, gamma=0, seed=0)
    default, _ = policy_positions(model, tok, heads, task, examples, answers)
    chat, _ = policy_positions(model, tok, heads, task, examples, answers, fmt=PromptFormat(chat_template=True))
    raw, _ = policy_positions(model, tok, heads, task, examples, answers, fmt=PromptFormat())
    assert torch.equal(default, chat)
    with pytest.raises(ValueError, match="plain decoding: gamma must be 0"):
        policy_positions(model, tok, heads, task, examples, GenerationConfig(max_new_tokens=4, gamma=2))
    assert default.shape != raw.shape or not torch.allclose(default, raw)
