"""Prompt lookup: the n-gram proposal, and drafting by it through the engine, exactly lossless."""

from __future__ import annotations

import pytest
import torch

from bebop.engine import Engine
from bebop.engine.lookup import PromptLookup
from bebop.engine.rollout import GenerationConfig
from bebop.models.config import ModelConfig
from bebop.models.transformer import Transformer
from exact_law import check_first_three, first_three_law


def test_the_longest_latest_match_proposes_what_followed_it():
    lookup = PromptLookup(max_ngram=3)
    #          0  1  2  3  4  5  6  7  8  9
    history = [5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 5, 6, 7]
    assert lookup.propose(history, 2) == [1, 2]  # "5 6 7" last followed by 1 2 (not the older 8 9)
    assert lookup.propose([1, 2, 3, 4, 2, 3], 3) == [4, 2, 3]  # "2 3" -> 4 2 3
    assert lookup.propose([1, 2, 3, 9, 3], 4) == [9, 3, 3, 3]  # one token follows "3": the last is repeated
    assert lookup.propose([1, 2, 3], 2) == [3, 3]  # no earlier occurrence: the last token repeated
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookup(max_ngram=1, min_ngram=2)


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=6, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
    return Transformer(config).eval()


def test_greedy_decoding_by_lookup_is_plain_greedy_decoding_and_accepts_some_drafts(policy):
    prompts = [[1, 2, 3, 1, 2], [4, 4, 4], [5, 0, 5, 0, 5]]
    plain = Engine(policy).generate(prompts, GenerationConfig(max_new_tokens=20, temperature=0, gamma=0))
    engine = Engine(policy, PromptLookup())
    for method in ("rs", "to", "greedy"):
        spec = engine.generate(prompts, GenerationConfig(max_new_tokens=20, temperature=0, gamma=3, method=method))
        assert spec.tokens == plain.tokens, method
        assert spec.stats["spec/num_accepted_tokens"] > 0  # greedy text on 6 ids repeats: the lookup finds it


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rs", "to"])
def test_the_first_three_tokens_drafted_by_lookup_follow_the_target_exactly(policy, method):
    """Chi-square of 24,000 rows' first three tokens against plain sampling's enumerated law, at γ = 1 and 2; the
    same counts against a wrong law are rejected."""
    vocab, n, prompt = 6, 24_000, [1, 2, 1, 2, 1]
    law = first_three_law(policy, prompt, vocab)
    engine = Engine(policy, PromptLookup())
    for gamma in (1, 2):
        rollout = engine.generate([prompt] * n, GenerationConfig(max_new_tokens=3, gamma=gamma, method=method, seed=7))
        check_first_three(rollout.tokens, law, vocab)
        assert 0.05 < rollout.stats["spec/acceptance_rate"] < 0.95


def test_the_index_proposes_what_the_scan_proposes():
    """LookupIndex, fed a history a few tokens at a time, matches and proposes as PromptLookup does on the whole."""
    from bebop.engine.lookup import LookupIndex

    generator = torch.Generator().manual_seed(0)
    for lookup in (PromptLookup(), PromptLookup(max_ngram=4, min_ngram=2)):
        for trial in range(20):
            history = torch.randint(0, 3 + trial % 5, (60,), generator=generator).tolist()
            index, fed = LookupIndex(lookup), 0
            while fed < len(history):
                step = 1 + (fed * 7 + trial) % 4
                index.extend(history[fed:fed + step])
                fed = min(fed + step, len(history))
                assert index.match() == lookup.match(history[:fed])
                assert index.propose(3) == lookup.propose(history[:fed], 3)
