"""Stop strings of several tokens: matched on decoded text, cut where they complete, the env callback at `</call>`,
and the text rewards see (without the stop)."""

from __future__ import annotations

import pytest
from real_tokenizer import chain, make_bpe_tokenizer, steered_pair

from bebop.data import tasks
from bebop.data.tokenizer import CharTokenizer, load_tokenizer
from bebop.engine import Engine, GenerationConfig
from bebop.engine.rollout import RolloutBuilder, find_stop
from bebop.prompting import completion_text, transcript_text
from bebop.rl.batch import collect


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(make_bpe_tokenizer(tmp_path_factory.mktemp("bpe")))


def test_find_stop_takes_the_first_new_match():
    assert find_stop("ab</call>cd", ["</call>"], 0) == (2, 9)
    assert find_stop("ab</call>cd", ["</call>"], 9) is None  # ended before `after`: not new
    assert find_stop("ab</call>cd", ["</call>"], 8) == (2, 9)  # completed by the text past `after`
    assert find_stop("x</a></call>", ["</call>", "</a>"], 0) == (1, 5)  # the one that ends first
    assert find_stop("xyz", ["</call>"], 0) is None


def test_stops_split_single_tokens_from_strings(tok):
    assert tok.stops(("<eos>", "</call>")) == ((tok.eos_id,), ("</call>",))
    assert len(tok.encode("</call>")) > 1
    char = CharTokenizer()
    assert char.stops(("<eos>", "</call>")) == ((char.eos_id, char.token_id("</call>")), ())


def test_a_stop_string_completed_mid_chunk_cuts_there(tok):
    """Chunks of gamma + 1 = 5 tokens after the prefill's first: `>` closes `</call>` at index 2 of the second chunk,
    and the two accepted tokens after it are dropped."""
    start, text = tok.encode("\n")[-1], "ABCDEF</call>GHI"
    ids = tok.encode(text)
    assert ids[6:9] == tok.encode("</call>")
    model, head = steered_pair(tok.vocab_size, chain(start, ids, tok.eos_id))
    for gamma in (0, 4):
        config = GenerationConfig(max_new_tokens=20, gamma=gamma, method="to", stop_strings=("</call>",), seed=0)
        rollout = Engine(model, head).generate([[start]], config, decode=tok.decode)
        assert rollout.tokens[0] == ids[:9]
        assert rollout.finish_reason == ["stop"]
        if gamma:
            assert rollout.origin[0][6:9] == ["accepted"] * 3  # the stop completed inside a verified chunk
    with pytest.raises(ValueError, match="decode"):
        Engine(model, head).generate([[start]], config)


def test_only_a_bounded_tail_is_decoded(tok):
    seen = []

    def decode(ids):
        seen.append(len(ids))
        return tok.decode(ids)

    out = RolloutBuilder(1, GenerationConfig(max_new_tokens=400, stop_strings=("</call>",)), decode=decode)
    for t in tok.encode("a b c d e f g h " * 20):
        out.append(0, [t], [0.0], [0.0], ["plain"])
    assert max(seen) <= 4 * len("</call>") + 1


def test_multi_token_call_triggers_the_env_and_rewards_see_no_stop(tok):
    task = tasks.get("agent")
    examples = task.sample(2, seed=0)
    start = tok.encode(examples[0].prompt)[-1]
    assert all(tok.encode(e.prompt)[-1] == start for e in examples)
    call, reply = tok.encode("<call>calc 1+2</call>"), tok.encode("<result>3</result>")
    assert reply[-1] == call[-1]  # both end in ">": after the reply the policy goes on to EOS
    model, head = steered_pair(tok.vocab_size, chain(start, call, tok.eos_id))
    for gamma in (0, 3):
        batch = collect(Engine(model, head), task, tok, examples,
                        GenerationConfig(max_new_tokens=30, gamma=gamma, method="to", seed=0), pad_id=tok.pad_id)
        for row, origin, text in zip(batch.rollout.tokens, batch.rollout.origin, batch.completions):
            assert row == call + reply + [tok.eos_id]
            assert origin[len(call):len(call) + len(reply)] == ["env"] * len(reply)
            assert text == "<call>calc 1+2</call><result>3</result>"  # no <|im_end|>


def test_texts_for_rewards_and_environments(tok):
    config = GenerationConfig(max_new_tokens=8, stop_tokens=(tok.eos_id,), stop_strings=("</call>",))
    ids = tok.encode("answer: 42") + [tok.eos_id]
    assert completion_text(tok, ids, "stop", config) == "answer: 42"
    assert completion_text(tok, ids, "length", config) == "answer: 42<|im_end|>"
    call = tok.encode("go<call>calc 1</call>")
    assert completion_text(tok, call, "stop", config) == "go<call>calc 1"
    assert transcript_text(tok, call, config) == "go<call>calc 1</call>"
    char = CharTokenizer()  # bebop's own tasks: "<eos>" is a stop token, and strip_completion still splits on it
    config = GenerationConfig(max_new_tokens=8, stop_tokens=char.stops(("<eos>",))[0])
    assert completion_text(char, char.encode("answer: 3<eos>"), "stop", config) == "answer: 3"
