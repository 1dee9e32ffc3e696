"""Stop strings of several tokens: matched on decoded text, cut where they complete, the env callback at `</call>`,
and the text rewards see (without the stop)."""

from __future__ import annotations

import pytest
from real_tokenizer import chain, make_bpe_tokenizer, steered_pair

from bebop.play import complete
from bebop.data import tasks
from bebop.data.tokenizer import CharTokenizer, load_tokenizer
from bebop.engine import Engine, GenerationConfig
from bebop.engine.rollout import RolloutBuilder
from bebop.engine.stops import Stop, StopMatcher, find_stop, split_stops, text_before, text_through
from bebop.rl.batch import Rollouts


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
    assert split_stops(("<eos>", "</call>"), tok.encode, tok.eos_id) == ((tok.eos_id,), ("</call>",))
    assert len(tok.encode("</call>")) > 1
    char = CharTokenizer()
    assert split_stops(("<eos>", "</call>"), char.encode, char.eos_id) == ((char.eos_id, char.token_id("</call>")), ())


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
        assert rollout.finish_reason == ["stop"] and rollout.stops == [Stop("</call>")]
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
        batch = Rollouts(Engine(model, head), task, tok).collect(
            examples, GenerationConfig(max_new_tokens=30, gamma=gamma, method="to", seed=0))
        for row, origin, text in zip(batch.rollout.tokens, batch.rollout.origin, batch.completions):
            assert row == call + reply + [tok.eos_id]
            assert origin[len(call):len(call) + len(reply)] == ["env"] * len(reply)
            assert text == "<call>calc 1+2</call><result>3</result>"  # no <|im_end|>
        done, _ = complete(Engine(model, head), tok, task, examples,  # eval-mtp, train-mtp and pretrain's path
                           GenerationConfig(max_new_tokens=30, gamma=gamma, method="to", seed=0))
        assert [c.text for c in done] == batch.completions


def _decided(tok, matcher: StopMatcher, ids: list[int]) -> tuple[list[int], Stop | None]:
    """The tokens a row keeps and its stop, as the engine decides them when `ids` arrive one step at a time."""
    kept: list[int] = []
    for t in ids:
        found = matcher.first(kept, [t])
        kept.append(t)
        if found is not None:
            return kept, found[1]
    return kept, None


def test_texts_for_rewards_and_environments_are_cut_where_the_stop_was_decided(tok):
    matcher = StopMatcher((tok.eos_id,), ("</call>",), tok.decode)
    ids, stop = _decided(tok, matcher, tok.encode("answer: 42") + [tok.eos_id])
    assert stop == Stop() and text_before(tok.decode, ids, stop) == "answer: 42"
    assert text_before(tok.decode, ids, None) == "answer: 42<|im_end|>"  # a row that ran out of budget keeps it all
    ids, stop = _decided(tok, matcher, tok.encode("go<call>calc 1</call>x"))
    assert stop.string == "</call>" and tok.decode(ids).endswith(">")  # "x" never joined the row
    assert text_before(tok.decode, ids, stop) == "go<call>calc 1"
    assert text_through(tok.decode, ids, stop) == "go<call>calc 1</call>"
    char = CharTokenizer()  # bebop's own tasks: "<eos>" is a stop token
    matcher = StopMatcher(split_stops(("<eos>",), char.encode, char.eos_id)[0], (), None)
    ids, stop = _decided(char, matcher, char.encode("answer: 3<eos>"))
    assert text_before(char.decode, ids, stop) == "answer: 3"


def test_a_token_that_runs_past_a_stop_string_keeps_its_text_out_of_both_texts():
    """A completing token may carry text past the string's end: the environment reads through the string's end,
    the reward before its start, counted from the record made when the token arrived."""
    pieces = ["say", " </ca", "ll>\n"]
    decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    at, stop = StopMatcher((), ("</call>",), decode).first([0], [1, 2])
    assert (at, stop) == (1, Stop("</call>", tail=1))
    assert text_through(decode, [0, 1, 2], stop) == "say </call>"
    assert text_before(decode, [0, 1, 2], stop) == "say "
