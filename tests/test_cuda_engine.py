"""The engine on a GPU: identity and distribution on CUDA, padding on CUDA, and one host sync per step. Skipped without
CUDA; `scripts/gpu-check` runs them (the compiled engine's tests, which compile for minutes, are
tests/test_cuda_graphs.py, a stage of their own)."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_engine import PROMPTS, _briefly_trained_head, _random_pair, check_first_three_tokens

from bebop.engine import Engine
from bebop.engine.buckets import Buckets
from bebop.engine.rollout import GenerationConfig
from bebop.models.config import ModelConfig
from bebop.models.selfdraft import self_draft_pair

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda")
SHAPE = ModelConfig.tiny(vocab_size=64, num_hidden_layers=2)


def _on_cuda(pair):
    return tuple(m.to(CUDA) for m in pair)


@pytest.mark.parametrize("head_kind", ["random", "trained", "self_draft"])
def test_greedy_identity_on_cuda(head_kind):
    model, head = _random_pair(SHAPE)
    if head_kind == "trained":
        head = _briefly_trained_head(model)
    elif head_kind == "self_draft":
        model, head = self_draft_pair(SHAPE)
    engine = Engine(*_on_cuda((model, head)))
    plain = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=16, temperature=0, gamma=0))
    for gamma, method in [*itertools.product([1, 3], ["rs", "to"]), (3, "greedy")]:
        spec = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=16, temperature=0, gamma=gamma, method=method))
        assert spec.tokens == plain.tokens, (gamma, method)
    if head_kind == "self_draft":
        rs = engine.generate(PROMPTS * 4, GenerationConfig(max_new_tokens=40, gamma=3, method="rs", seed=0))
        assert rs.stats["spec/acceptance_rate"] > 0.99  # q = p: RS accepts every draft on CUDA too


@pytest.mark.parametrize("method", ["rs", "to"])
def test_first_three_tokens_match_plain_sampling_on_cuda(method):
    check_first_three_tokens(method, CUDA)


def _same_run(got, want, logprob_tol: float) -> None:
    assert got.tokens == want.tokens and got.origin == want.origin and got.finish_reason == want.finish_reason
    for a, b in zip(got.logprobs, want.logprobs):
        assert a == pytest.approx(b, abs=logprob_tol)


def _stopping_config(engine: Engine, gamma: int, method: str, **sampling) -> GenerationConfig:
    """Seeded sampling whose rows stop at different steps (tokens the rows emit early are the stops)."""
    config = GenerationConfig(max_new_tokens=24, gamma=gamma, method=method, seed=5, **sampling)
    free = engine.generate(PROMPTS, config).tokens
    return GenerationConfig(max_new_tokens=24, gamma=gamma, method=method, seed=5, stop_tokens=(free[0][2], free[2][6]),
                            **sampling)


def test_padded_engine_on_cuda_returns_what_the_exact_one_does():
    model, head = _on_cuda(_random_pair(SHAPE, seed=3))
    exact, padded = Engine(model, head), Engine(model, head, buckets=Buckets(rows=(2, 8), kv_multiple=16))
    for gamma, method in ((0, "rs"), (3, "rs"), (3, "to")):
        config = _stopping_config(exact, gamma, method)
        _same_run(padded.generate(PROMPTS, config), exact.generate(PROMPTS, config), 1e-5)


def check_one_host_sync_per_step(compile: bool) -> None:
    """Under torch's sync debug mode "error", any synchronising call raises: a whole generate() (prefill, steps with
    retiring rows, compaction) runs without one. The marked HOST SYNC waits on an event, which the mode allows."""
    model, head = _on_cuda(_random_pair(SHAPE, seed=3))
    engine = Engine(model, head, compile=compile)
    config = _stopping_config(engine, 3, "rs")
    engine.generate(PROMPTS, config)  # warm-up: compilation and graph recording synchronise
    engine.generate(PROMPTS, config)
    torch.cuda.synchronize(CUDA)
    torch.cuda.set_sync_debug_mode("error")
    try:
        rollout = engine.generate(PROMPTS, config)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert rollout.stats["num_steps"] > 1


def test_one_host_sync_per_step():
    check_one_host_sync_per_step(compile=False)  # compiled: tests/test_cuda_graphs.py
