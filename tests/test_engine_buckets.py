"""The engine's static shapes (bebop.engine.buckets): padded rows and rounded cache lengths change no output.

This is what proves the padding logic the CUDA-graph engine runs on: on CPU, from the same seed, a bucketed engine
(finished rows left as padding, compaction into smaller buckets, attention over rounded-up slots, pooled caches)
returns what the unpadded engine returns: tokens, origins, finish reasons and counters exactly, log-probs and
entropies up to float rounding.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_engine import _stop_on

from bebop.engine import Engine
from bebop.engine.buckets import Buckets
from bebop.engine.rollout import GenerationConfig
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15], [16, 17], [18, 19, 20, 21, 22]]
SMALL = Buckets(rows=(2, 4, 8), kv_multiple=8)


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=64, num_hidden_layers=2)
    return Transformer(config).eval(), MTPHead(config).eval()


def test_buckets_round_up_and_refuse_bad_sizes():
    b = Buckets(rows=(1, 4, 16), kv_multiple=32)
    assert [b.capacity(n) for n in (1, 2, 4, 5, 16, 17, 40)] == [1, 4, 4, 16, 16, 32, 48]
    assert (b.kv_len(1, 100), b.kv_len(33, 100), b.kv_len(97, 100)) == (32, 64, 100)
    assert (b.cache_len(33), b.cache_len(33, limit=40), b.cache_len(50, limit=40)) == (96, 40, 50)
    assert b.kv_len(64, b.cache_len(64)) < b.cache_len(64)  # a step never attends over the whole cache
    exact = Buckets.exact()
    assert not exact.padded and exact.capacity(5) == 5 and exact.kv_len(7, 100) == 7
    for bad in (dict(rows=(4, 2)), dict(rows=(0, 2)), dict(rows=(2, 2)), dict(kv_multiple=0)):
        with pytest.raises(ValueError, match="Buckets"):
            Buckets(**bad)


def _same(a, b):
    """Equal, up to float rounding in the log-probs and entropies: a different batch size or attended length
    changes how a matmul blocks its sums, so their last bits (fp32: ~1e-7) may differ."""
    assert a.tokens == b.tokens
    for x, y in ((a.logprobs, b.logprobs), (a.entropy, b.entropy)):
        assert [len(r) for r in x] == [len(r) for r in y]
        torch.testing.assert_close(torch.tensor(sum(x, [])), torch.tensor(sum(y, [])), atol=1e-5, rtol=0)
    assert a.origin == b.origin and a.finish_reason == b.finish_reason
    spec = sorted(k for k in a.stats if k.startswith("spec/"))
    assert spec == sorted(k for k in b.stats if k.startswith("spec/"))
    for k in spec:  # counts exactly; rates and entropy means up to the rounding above
        x, y = a.stats[k], b.stats[k]
        assert type(x) is type(y) and (x == y if not isinstance(x, float) else
                                       x == pytest.approx(y, rel=1e-6, abs=1e-6, nan_ok=True)), k


@pytest.mark.parametrize("gamma,method", [(0, "rs"), (3, "rs"), (3, "to"), (2, "greedy")])
def test_padded_engine_returns_what_the_exact_engine_returns(pair, gamma, method):
    model, head = pair
    exact, padded = Engine(model, head), Engine(model, head, buckets=SMALL)
    config = GenerationConfig(max_new_tokens=30, gamma=gamma, method=method, seed=2,
                              temperature=0 if method == "greedy" else 1.0)
    free = exact.generate(PROMPTS, config).tokens
    # Tokens the rows emit early, as stops: rows finish at different steps (padding, then compaction).
    config = replace(config, stop_tokens=tuple(free[row][at] for row, at in ((0, 1), (1, 3), (2, 6), (3, 10))))
    want = exact.generate(PROMPTS, config)
    _same(padded.generate(PROMPTS, config), want)
    sizes = {rows for _, rows in padded.pool.caches}
    assert max(sizes) == 8 and min(sizes) < 8, f"the run should have compacted from 8 rows: {sizes}"
    # Environment turns feed some rows in the middle of a padded batch.
    want = exact.generate(PROMPTS, config, env=_stop_on([7, 8, 9], turns=2))
    _same(padded.generate(PROMPTS, config, env=_stop_on([7, 8, 9], turns=2)), want)


def test_padding_rows_never_outgrow_the_cache(pair):
    """A row that stops at once stays as padding for the whole run, advancing with every step: it must stay
    inside its cache (a write past it raises) without touching the live rows' results."""
    model, head = pair
    prompts = [[1, 2], [3, 4, 5], [6]]
    first = Engine(model, head).generate(prompts, GenerationConfig(max_new_tokens=1, gamma=0, seed=1)).tokens
    config = GenerationConfig(max_new_tokens=60, gamma=3, seed=1, stop_tokens=(first[0][0],))
    one_bucket = Buckets(rows=(4,), kv_multiple=8)
    want = Engine(model, head).generate(prompts, config)
    assert len(want.tokens[0]) == 1 and max(len(t) for t in want.tokens) > 20
    _same(Engine(model, head, buckets=one_bucket).generate(prompts, config), want)


def test_pooled_caches_keep_their_buffers_across_calls(pair):
    """CUDA graphs record addresses: a padded engine writes every call into the same cache buffers."""
    model, head = pair
    engine = Engine(model, head, buckets=SMALL)
    config = GenerationConfig(max_new_tokens=10, gamma=3, seed=0)
    engine.generate(PROMPTS, config)
    pointers = {key: (c.k.data_ptr(), c.v.data_ptr(), c.lengths.data_ptr()) for key, c in engine.pool.caches.items()}
    engine.generate(PROMPTS, GenerationConfig(max_new_tokens=10, gamma=3, seed=1))
    after = {key: (c.k.data_ptr(), c.v.data_ptr(), c.lengths.data_ptr()) for key, c in engine.pool.caches.items()}
    assert (id(model), 8) in pointers and (id(head), 8) in pointers  # the caches for the 6 prompts
    assert {key: after[key] for key in pointers} == pointers


def test_copy_rows_to_writes_into_the_given_buffers(pair):
    model, _ = pair
    cache, out = model.new_cache(3, 8), model.new_cache(2, 8)
    cache.k.normal_()
    cache.lengths.copy_(torch.tensor([1, 2, 3]))
    pointer = out.k.data_ptr()
    cache.copy_rows_to(torch.tensor([2, 0]), out)
    assert out.k.data_ptr() == pointer and out.lengths.tolist() == [3, 1]
    assert torch.equal(out.k[:, 0], cache.k[:, 2]) and torch.equal(out.k[:, 1], cache.k[:, 0])
    with pytest.raises(ValueError, match="copy_rows_to"):
        cache.copy_rows_to(torch.tensor([0]), out)
