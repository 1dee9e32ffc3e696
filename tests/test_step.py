"""The layouts bebop.engine.step shares with the engine: a step's uniforms and the host table."""

from __future__ import annotations

import pytest
import torch

from bebop.engine import Engine
from bebop.engine import generate as engine_module
from bebop.engine.ragged import layout_of
from bebop.engine.rollout import GenerationConfig
from bebop.engine.step import (
    draft_uniforms,
    draw_uniforms,
    pack_host_table,
    unpack_host_row,
    verify_rows,
    verify_uniforms,
)
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer
from bebop.sampling import entropy, probs_from_logits
from bebop.verify import Drafts

ROWS, GAMMA = 3, 3


def _replay(rows: int, method: str, gamma: int, generator: torch.Generator) -> torch.Tensor:
    """The documented order, drawn by hand: each "rs" draft, then the γ acceptance tests, then the next token."""
    rand = lambda n: torch.rand(rows, n, dtype=torch.float64, generator=generator)  # noqa: E731
    if gamma == 0:
        return rand(1)
    if method == "greedy":
        return torch.zeros(rows, gamma + 1, dtype=torch.float64)
    drafts = [rand(1) for _ in range(gamma)] if method == "rs" else []
    return torch.cat([*drafts, rand(gamma), rand(1)], 1)


@pytest.mark.parametrize("method, gamma", [("rs", GAMMA), ("to", GAMMA), ("rs", 0), ("to", 0), ("greedy", 0)])
def test_uniforms_replay_the_generator_in_the_documented_order(method, gamma):
    generator = torch.Generator().manual_seed(5)
    uniforms = draw_uniforms(ROWS, gamma, method, generator, torch.device("cpu"))  # [B, n]
    want = _replay(ROWS, method, gamma, torch.Generator().manual_seed(5))
    assert torch.equal(uniforms, want)
    assert torch.equal(verify_uniforms(uniforms, gamma), want[:, -(gamma + 1):])
    if method == "rs":
        assert torch.equal(draft_uniforms(uniforms, gamma), want[:, :gamma])


def test_greedy_draws_nothing():
    generator = torch.Generator().manual_seed(5)
    state = generator.get_state()
    uniforms = draw_uniforms(ROWS, GAMMA, "greedy", generator, torch.device("cpu"))
    assert torch.equal(uniforms, torch.zeros(ROWS, GAMMA + 1, dtype=torch.float64))
    assert torch.equal(generator.get_state(), state)


@pytest.mark.parametrize("method, gamma", [("rs", 2), ("to", 2), ("greedy", 2), ("rs", 0)])
def test_the_engine_draws_the_documented_layout(monkeypatch, method, gamma):
    """Each step's draws are draw_uniforms' for that step's rows, and the generator is the engine's own."""
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=32, num_hidden_layers=1)
    model, head = Transformer(config).eval(), MTPHead(config).eval()
    calls = []

    def spy(rows, gamma_, method_, generator, device):
        state = generator.get_state()
        uniforms = draw_uniforms(rows, gamma_, method_, generator, device)
        calls.append((rows, gamma_, method_, state, uniforms))
        return uniforms

    monkeypatch.setattr(engine_module, "draw_uniforms", spy)
    Engine(model, head).generate([[1, 2], [3]], GenerationConfig(max_new_tokens=6, gamma=gamma, method=method, seed=3))
    assert calls and all(c[1:3] == (gamma, method) for c in calls)
    for rows, _, _, state, uniforms in calls:
        replay = torch.Generator()
        replay.set_state(state)
        assert torch.equal(uniforms, _replay(rows, method, gamma, replay))


def test_pack_unpack_round_trip():
    num_accepted = torch.tensor([0, 2, 1])  # [B]
    emitted = torch.tensor([[5, 9, 9], [3, 4, 7], [8, 6, 6]])  # [B, γ+1]: accepted drafts, then next repeated
    logprobs = -torch.arange(9, dtype=torch.float32).view(3, 3) / 4  # [B, γ+1]
    entropies = torch.arange(9, dtype=torch.float32).view(3, 3) / 8  # [B, γ+1]
    table = pack_host_table(num_accepted, emitted, logprobs, entropies)
    assert table.shape == (3, 3 * 2 + 4) and table.dtype == torch.float64
    rows = [unpack_host_row(row, 2) for row in table.tolist()]
    assert [r.num_accepted for r in rows] == [0, 2, 1]
    assert [r.tokens for r in rows] == [[5], [3, 4, 7], [8, 6]]
    assert [r.logprobs for r in rows] == [logprobs[b, : n + 1].double().tolist() for b, n in enumerate([0, 2, 1])]
    assert [r.entropies for r in rows] == [entropies[b, : n + 1].double().tolist() for b, n in enumerate([0, 2, 1])]
    assert [r.verified_entropies for r in rows] == entropies[:, :2].double().tolist()


@pytest.mark.parametrize("method", ["rs", "to"])
def test_unpacked_rows_are_what_verify_rows_computed(method):
    torch.manual_seed(1)
    config = ModelConfig.tiny(vocab_size=32, num_hidden_layers=1)
    model, vocab, sampling = Transformer(config).eval(), config.vocab_size, (1.0, None, None)
    prompt = torch.randint(0, vocab, (ROWS, 4))  # [B, P]
    cache = model.new_cache(ROWS, 16)
    with torch.no_grad():
        model(prompt, cache)
        cache.lengths += 4
        pending = torch.randint(0, vocab, (ROWS,))  # [B]
        draft_probs = torch.softmax(torch.randn(ROWS, GAMMA, vocab), -1)  # [B, γ, V]
        drafts = torch.multinomial(draft_probs.view(-1, vocab), 1).view(ROWS, GAMMA)  # [B, γ]
        uniforms = draw_uniforms(ROWS, GAMMA, method, torch.Generator().manual_seed(2), torch.device("cpu"))
        one_hot = torch.full((ROWS,), method != "rs")
        hats = torch.where(one_hot[:, None], 1.0, draft_probs.gather(-1, drafts[..., None])[..., 0])  # [B, γ]
        verified = Drafts(drafts, hats, torch.full((ROWS,), GAMMA), one_hot, draft_probs if method == "rs" else None)
        host, num_accepted, next_token, emitted, _ = verify_rows(
            model, pending, verified, cache, uniforms, kv_len=4 + GAMMA + 1, method=method, sampling=sampling,
            layout=layout_of([GAMMA + 1] * ROWS, ROWS, torch.device("cpu")))
        logits, _ = model(torch.cat([pending[:, None], drafts], 1), cache, kv_len=4 + GAMMA + 1)  # [B, γ+1, V]
    target_probs = probs_from_logits(logits, *sampling)  # [B, γ+1, V]
    for b, row in enumerate(unpack_host_row(r, GAMMA) for r in host.tolist()):
        n = int(num_accepted[b])
        assert row.num_accepted == n
        assert row.tokens == [*drafts[b, :n].tolist(), int(next_token[b])] == emitted[b, : n + 1].tolist()
        want_logp = target_probs[b, torch.arange(n + 1), torch.tensor(row.tokens)].log()  # [n+1]
        assert row.logprobs == pytest.approx(want_logp.tolist(), abs=1e-6)
        assert row.entropies == pytest.approx(entropy(target_probs[b, : n + 1]).tolist(), abs=1e-6)
        assert row.verified_entropies == pytest.approx(entropy(target_probs[b, :GAMMA]).tolist(), abs=1e-6)
