"""The speculative engine: lossless output, exact bookkeeping, clear errors."""

from __future__ import annotations

import itertools
import warnings
from dataclasses import replace

import pytest
import torch
from scipy.stats import chisquare

import bebop.sampling
from bebop.engine import Engine
from bebop.engine.depth import Choice, DepthConfig, DepthController, FixedDepth
from bebop.engine.generate import TIMING
from bebop.engine.rollout import GenerationConfig, RolloutBuilder
from bebop.losses import draft_loss
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead, chain_targets
from bebop.models.selfdraft import self_draft_pair
from bebop.models.transformer import Transformer
from exact_law import near_draft_pair

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15]]


def _random_pair(config: ModelConfig, seed: int = 0) -> tuple[Transformer, MTPHead]:
    torch.manual_seed(seed)
    return Transformer(config).eval(), MTPHead(config).eval()


def _briefly_trained_head(model: Transformer, steps: int = 15) -> MTPHead:
    """A head fitted for a few steps with e2e TV on the model's own greedy continuations."""
    torch.manual_seed(1)
    head = MTPHead(model.config, trained_depth=3)
    model.requires_grad_(False)
    optimizer = torch.optim.AdamW(head.parameters(), lr=3e-3)
    tokens = torch.randint(0, model.config.vocab_size, (4, 24))
    for _ in range(steps):
        with torch.no_grad():
            logits, hidden = model(tokens)
        target_logits, labels, mask = chain_targets(logits, tokens, 3)
        loss = draft_loss(head.chain(model, hidden, tokens, 3), target_logits, objective="e2e_tv", mask=mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()


@pytest.fixture(scope="module")
def tiny_pair():
    return _random_pair(ModelConfig.tiny(vocab_size=64, num_hidden_layers=2))


@pytest.mark.parametrize("head_kind", ["random", "trained", "self_draft", "two_layer"])
def test_greedy_identity(tiny_pair, head_kind):
    model, head = tiny_pair
    if head_kind == "trained":
        head = _briefly_trained_head(model)
    elif head_kind == "two_layer":  # a deeper head (tests/test_deep_head.py), its second layer random
        torch.manual_seed(1)
        head = MTPHead(model.config, num_layers=2).eval()
    elif head_kind == "self_draft":
        model, head = self_draft_pair(ModelConfig.tiny(vocab_size=64, num_hidden_layers=2))
    engine = Engine(model, head)
    plain = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=16, temperature=0, gamma=0))
    for gamma, method in [*itertools.product([1, 2, 3, 5], ["rs", "to"]), (3, "greedy")]:
        spec = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=16, temperature=0, gamma=gamma, method=method))
        assert spec.tokens == plain.tokens, (gamma, method)
        assert spec.stats["spec/num_drafts"] > 0
    if head_kind == "self_draft":
        assert spec.stats["spec/acceptance_rate"] > 0.99


def _exact_first_three(model: Transformer, prompt: list[int], vocab: int) -> torch.Tensor:
    """Exact plain-sampling law of the first three generated tokens, [V, V, V], by enumeration."""
    prefixes = torch.tensor([prompt + [a, b] for a in range(vocab) for b in range(vocab)])  # [V², P+2]
    with torch.no_grad():
        probs = torch.softmax(model(prefixes)[0].double(), -1)  # [V², P+2, V]
    p1 = probs[0, len(prompt) - 1]  # [V]
    p2 = probs[:, len(prompt)].view(vocab, vocab, vocab)[:, 0]  # [V(a), V(b)]: p(b | a)
    p3 = probs[:, len(prompt) + 1].view(vocab, vocab, vocab)  # [a, b, c]: p(c | a, b)
    return p1[:, None, None] * p2[:, :, None] * p3


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rs", "to"])
def test_first_three_tokens_match_plain_sampling(method):
    check_first_three_tokens(method, torch.device("cpu"))


def check_first_three_tokens(method: str, device: torch.device, *, compile: bool = False) -> None:
    """RS / TO at γ = 1, 2 draw the first three tokens from plain sampling's exact law (chi-square), on `device`."""
    vocab, n = 5, 24_000
    model, head = near_draft_pair(vocab)
    prompt = [1, 2]
    exact = _exact_first_three(model, prompt, vocab).flatten()
    engine = Engine(model.to(device), head.to(device), compile=compile)
    for gamma in (1, 2):
        rollout = engine.generate([prompt] * n, GenerationConfig(max_new_tokens=3, gamma=gamma, method=method, seed=7))
        codes = torch.tensor([t[0] * vocab * vocab + t[1] * vocab + t[2] for t in rollout.tokens])
        observed = torch.bincount(codes, minlength=vocab**3).double()
        keep = exact * n >= 5  # chi-square needs expected counts >= 5; pool the rest into one cell
        f_obs = torch.cat([observed[keep], observed[~keep].sum()[None]])
        f_exp = torch.cat([exact[keep], exact[~keep].sum()[None]]) * n
        assert chisquare(f_obs.numpy(), f_exp.numpy()).pvalue > 1e-3, (method, gamma)
        rate = rollout.stats["spec/acceptance_rate"]
        assert 0.05 < rate < 0.95, f"test needs both accepts and rejections, got acceptance {rate}"
        # The same counts against a wrong law (the first token's marginal shuffled) must be rejected.
        wrong = exact.view(vocab, -1)[torch.roll(torch.arange(vocab), 1)].flatten()
        w_exp = torch.cat([wrong[keep], wrong[~keep].sum()[None]]) * n
        assert chisquare(f_obs.numpy(), (w_exp * f_obs.sum() / w_exp.sum()).numpy()).pvalue < 1e-6


@pytest.mark.parametrize("gamma", [0, 2])
def test_a_shared_prompt_is_prefilled_once_and_decodes_as_if_each_row_had_its_own(tiny_pair, gamma, monkeypatch):
    """A GRPO group's rows share their prompt: the prefill runs it once and copies its K/V (the head's too), and the
    rollout is the one every row prefilled on its own gives, token for token and log-prob for log-prob."""
    import bebop.engine.generate as generate

    model, head = tiny_pair
    prompts = [PROMPTS[0]] * 3 + [PROMPTS[1]] * 2 + [PROMPTS[0][:2]] + [PROMPTS[1]]  # [7], 3 distinct
    config = GenerationConfig(max_new_tokens=12, gamma=gamma, seed=3)
    engine = Engine(model, head if gamma else None)
    widths = []
    prefill = engine.target_step
    engine.target_step = lambda tokens, *a, **k: (widths.append(tuple(tokens.shape)), prefill(tokens, *a, **k))[1]
    shared = engine.generate(prompts, config)
    assert widths[0] == (3, len(PROMPTS[1]))  # the prefill: one row per distinct prompt
    own_rows = lambda feeds: (list(range(len(feeds))), list(range(len(feeds))))  # noqa: E731
    monkeypatch.setattr(generate, "shared_runs", own_rows)
    alone = Engine(model, head if gamma else None).generate(prompts, config)
    assert shared.tokens == alone.tokens and shared.origin == alone.origin
    assert shared.tokens[0] != shared.tokens[1] or shared.tokens[1] != shared.tokens[2]  # each row draws its own
    for a, b in zip(shared.logprobs, alone.logprobs):
        assert a == pytest.approx(b, abs=1e-5)


def test_shared_runs():
    from bebop.engine.batch import shared_runs

    feeds = [(0, 0, [1, 2]), (1, 0, [3]), (2, 0, [1, 2]), (3, 5, [1, 2]), (4, 5, [1, 2]), (5, 0, [3])]
    # Prompts at 0 are shared; feeds past a row's own transcript (start 5) never are.
    assert shared_runs(feeds) == ([0, 1, 3, 4], [0, 1, 0, 2, 3, 1])


def test_logprobs_and_entropy_match_a_full_forward(tiny_pair):
    model, head = tiny_pair
    rollout = Engine(model, head).generate(PROMPTS, GenerationConfig(max_new_tokens=20, gamma=3, seed=0))
    for prompt, tokens, logprobs, entropy in zip(PROMPTS, rollout.tokens, rollout.logprobs, rollout.entropy):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens]))[0][0, len(prompt) - 1 : -1]  # [N, V]
        logp = torch.log_softmax(logits.double(), -1)
        torch.testing.assert_close(torch.tensor(logprobs, dtype=torch.double),
                                   logp.gather(-1, torch.tensor(tokens)[:, None])[:, 0], atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.tensor(entropy, dtype=torch.double),
                                   -(logp.exp() * logp).sum(-1), atol=1e-4, rtol=0)


def test_self_draft_acceptance_and_counters():
    model, head = self_draft_pair(ModelConfig.tiny(vocab_size=64, num_hidden_layers=2))
    engine = Engine(model, head)
    rs = engine.generate(PROMPTS * 4, GenerationConfig(max_new_tokens=40, gamma=3, method="rs", seed=0))
    assert rs.stats["spec/acceptance_rate"] > 0.99
    assert rs.stats["spec/accept_length"] > 3.9
    to = engine.generate(PROMPTS * 4, GenerationConfig(max_new_tokens=40, gamma=3, method="to", seed=0))
    assert to.stats["spec/acceptance_rate"] < 0.9  # p(argmax q) = max p < 1 at temperature 1
    for rollout in (rs, to):
        s = rollout.stats
        assert s["spec/num_draft_tokens"] == 3 * s["spec/num_drafts"]
        assert sum(s[f"spec/num_accepted_tokens_per_pos/{i}"] for i in range(3)) == s["spec/num_accepted_tokens"]
        origins = [o for row in rollout.origin for o in row]
        assert origins.count("accepted") <= s["spec/num_accepted_tokens"]
        assert set(origins) <= {"plain", "accepted", "recovered", "bonus"}


def test_stop_tokens_budget_and_origin(tiny_pair):
    model, head = tiny_pair
    engine = Engine(model, head)
    free = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=30, gamma=3, seed=5))
    stop = free.tokens[0][4]
    stopped = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=30, gamma=3, seed=5, stop_tokens=(stop,)))
    for tokens, reason, logp, ent, origin in zip(stopped.tokens, stopped.finish_reason, stopped.logprobs,
                                                  stopped.entropy, stopped.origin):
        assert len(tokens) == len(logp) == len(ent) == len(origin) <= 30
        if reason == "stop":
            assert tokens[-1] == stop and stop not in tokens[:-1]
        else:
            assert reason == "length" and len(tokens) == 30 and stop not in tokens
        assert origin[0] == "plain"
    assert stopped.finish_reason[0] == "stop" and len(stopped.tokens[0]) <= 5


@pytest.mark.slow
@pytest.mark.compile  # `make test-compiled`: minutes to compile from an empty cache on 2 cores
def test_compiled_engine_computes_what_the_eager_one_does():
    """compile=True changes how the steps run, not what they compute: the compiled target forward gives eager
    hidden states; at temperature 0 the compiled engine emits eager plain decoding's tokens (ragged prompts, plain and
    speculative steps, a stop token retiring rows); sampling, it draws the same
    uniforms from the same seed, so RS and TO with a head that disagrees with the target (rejections, recovered
    tokens) emit the eager engine's tokens and log-probs. It also samples the weights as they are now: after an
    in-place update it follows the new weights (a frozen copy would not)."""
    model, head = _random_pair(ModelConfig.tiny(vocab_size=64, num_hidden_layers=2), seed=3)
    eager, compiled = Engine(model, head), Engine(model, head, compile=True)
    # The forward generate()'s prefill runs, on a cache made as it makes its own: one graph serves both (a tensor
    # made outside inference mode, or logits asked for, would compile the model again, for minutes on 2 cores)
    with torch.inference_mode():
        tokens = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13], [14, 15, 16]])
        cache = model.new_cache(len(PROMPTS), 12)
        cache.lengths.copy_(torch.tensor([3, 7, 0, 5]))
        want = model(tokens, cache, kv_len=10, compute_logits=False)[1]
        cache.lengths.copy_(torch.tensor([3, 7, 0, 5]))
        got = compiled.target_step(tokens, cache, kv_len=10, compute_logits=False)[1]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)

    def greedy(engine, prompts, gamma, stop=()):
        config = GenerationConfig(max_new_tokens=12, temperature=0, gamma=gamma, stop_tokens=stop)
        return engine.generate(prompts, config).tokens

    before = greedy(eager, PROMPTS, 0)
    stop = (before[0][3],)
    # One batch size: each further one (batch 1 above all, which torch specialises) compiles anew for minutes on
    # 2 cores; `bebop bench engine` sweeps the sizes.
    for stops, gammas in (((), (0, 3)), (stop, (3,))):
        want = greedy(eager, PROMPTS, 0, stops)
        for gamma in gammas:
            assert greedy(compiled, PROMPTS, gamma, stops) == want, (gamma, stops)
    for method in ("rs", "to"):
        config = GenerationConfig(max_new_tokens=12, gamma=3, method=method, seed=5)
        want, got = eager.generate(PROMPTS, config), compiled.generate(PROMPTS, config)
        assert got.tokens == want.tokens and got.origin == want.origin, method
        assert got.stats["spec/acceptance_rate"] < 1 and (method == "to" or got.stats["spec/acceptance_rate"] > 0)
        for a, b in zip(got.logprobs, want.logprobs):
            assert a == pytest.approx(b, abs=1e-4)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    after = greedy(eager, PROMPTS, 0)
    assert after != before
    assert greedy(compiled, PROMPTS, 3) == greedy(compiled, PROMPTS, 0) == after


def test_seeded_runs_are_reproducible(tiny_pair):
    engine = Engine(*tiny_pair)
    config = GenerationConfig(max_new_tokens=16, gamma=2, seed=11)
    assert engine.generate(PROMPTS, config).tokens == engine.generate(PROMPTS, config).tokens
    other = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=16, gamma=2, seed=12))
    assert other.tokens != engine.generate(PROMPTS, config).tokens


class _RaggedRows(DepthController):
    """Each row its own depth, fixed by its place in the batch (0, 1, 2, 0, ...): ragged verification without the
    wall-clock costs `gamma="rows"` learns from, which would let two runs of one seed choose different depths."""

    def decide(self, rows: int) -> Choice:
        depths = tuple(b % 3 for b in range(rows))
        return Choice(max(depths), rows, rows, self.expected_accepted(max(depths)), None, False, depths=depths,
                      budget=rows + sum(depths))


@pytest.mark.parametrize("gamma", [0, 2, "ragged"])
def test_the_verification_s_scores_by_blocks_decode_what_the_whole_tensor_does(tiny_pair, gamma, monkeypatch):
    """The engine's verification takes the target's scores a block of positions at a time over a large vocabulary
    (`bebop.sampling.scores_normaliser_entropy`); at one position per block it emits the tokens, log-probs and
    entropies of the whole-tensor pass, every bit of them (plain, speculative, each row its own depth)."""
    ragged = gamma == "ragged"
    config = GenerationConfig(max_new_tokens=12, gamma="auto" if ragged else gamma, max_gamma=2, seed=5,
                              temperature=0.8)

    def decode():
        engine = Engine(*tiny_pair, depth=_RaggedRows(DepthConfig(2)) if ragged else None)
        return engine.generate(PROMPTS, config)
    whole = decode()
    monkeypatch.setattr(bebop.sampling, "BLOCK_BYTES", 4 * tiny_pair[0].config.vocab_size)
    monkeypatch.setattr(bebop.sampling, "WHOLE_BLOCKS", 0)
    blocks = decode()
    assert blocks.tokens == whole.tokens and blocks.logprobs == whole.logprobs
    assert blocks.entropy == whole.entropy
    if ragged:
        assert whole.stats["spec/num_accepted_tokens"] > 0  # rows at depths 1 and 2 drafted and were verified


def test_an_unseeded_run_draws_its_seed_from_the_global_generator(tiny_pair):
    """seed=None takes a seed from torch's global generator without reseeding it: torch.manual_seed makes such a
    run repeat, successive runs differ, and what the caller's generator draws next is not changed behind its back
    (reseeding it from OS entropy made every later test's random init unrepeatable)."""
    engine, config = Engine(*tiny_pair), GenerationConfig(max_new_tokens=16, gamma=2)

    def run() -> tuple[list[list[int]], float]:
        tokens = engine.generate(PROMPTS, config).tokens
        return tokens, torch.rand(()).item()

    torch.manual_seed(123)
    first, second = run(), run()
    torch.manual_seed(123)
    assert run() == first and run() == second
    assert first[0] != second[0]


def test_bf16_runs(tiny_pair):
    model, head = (m.to(torch.bfloat16) for m in _random_pair(ModelConfig.tiny(vocab_size=64, num_hidden_layers=2)))
    rollout = Engine(model, head).generate(PROMPTS, GenerationConfig(max_new_tokens=12, gamma=3, seed=0))
    assert all(len(t) == 12 for t in rollout.tokens)
    assert all(torch.isfinite(torch.tensor(lp)).all() for lp in rollout.logprobs)


def test_clear_errors(tiny_pair):
    model, head = tiny_pair
    engine = Engine(model, head)
    config = GenerationConfig(max_new_tokens=8)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[1], []], config)
    with pytest.raises(ValueError, match="prompts is empty"):
        engine.generate([], config)
    with pytest.raises(ValueError, match="out of range"):
        engine.generate([[1, 64]], config)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        engine.generate([[1] * model.config.max_position_embeddings], config)
    with pytest.raises(ValueError, match="needs a draft"):
        Engine(model).generate([[1]], GenerationConfig(max_new_tokens=4, method="rs"))
    trained = MTPHead(model.config, trained_depth=2)
    with pytest.warns(UserWarning, match="trained depth"):
        Engine(model, trained).generate([[1]], GenerationConfig(max_new_tokens=4, gamma=3))
    with warnings.catch_warnings():  # auto prices the untrained positions by what they are measured to accept
        warnings.simplefilter("error")
        Engine(model, trained).generate([[1]], GenerationConfig(max_new_tokens=4, gamma="auto", max_gamma=3))
    with pytest.raises(ValueError, match="hidden_size"):
        Engine(model, MTPHead(ModelConfig.tiny(vocab_size=64, hidden_size=128, head_dim=32)))
    for bad in (dict(max_new_tokens=0), dict(max_new_tokens=4, gamma=-1), dict(max_new_tokens=4, method="x"),
                dict(max_new_tokens=4, temperature=-1.0), dict(max_new_tokens=4, top_p=0.0)):
        with pytest.raises(ValueError):
            GenerationConfig(**bad)


def _stop_on(reply: list[int], turns: int):
    """An env that answers the first `turns` stops of each row with `reply`."""
    seen: dict[int, int] = {}

    def env(row: int, tokens: list[int], stop):
        seen[row] = seen.get(row, 0) + 1
        return reply if seen[row] <= turns else None

    return env


@pytest.mark.parametrize("gamma", [0, 3])
def test_env_replies_continue_from_the_cache(tiny_pair, gamma):
    model, head = tiny_pair
    engine = Engine(model, head)
    reply, stops = [7, 8, 9], tuple(range(0, 64, 5))  # many stop tokens, so every row takes env turns
    greedy = GenerationConfig(max_new_tokens=40, gamma=gamma, temperature=0, stop_tokens=stops)
    spec = engine.generate(PROMPTS, greedy, env=_stop_on(reply, turns=2))
    plain = Engine(model).generate(PROMPTS, replace(greedy, gamma=0), env=_stop_on(reply, turns=2))
    assert spec.tokens == plain.tokens  # greedy identity holds across environment turns
    sampled = GenerationConfig(max_new_tokens=40, gamma=gamma, seed=4, stop_tokens=stops)
    rollout = engine.generate(PROMPTS, sampled, env=_stop_on(reply, turns=2))
    assert sum(origin.count("env") for origin in rollout.origin) >= 3 * len(reply)
    for prompt, tokens, origin, mask, logprobs in zip(PROMPTS, rollout.tokens, rollout.origin,
                                                      rollout.policy_mask, rollout.logprobs):
        assert mask == [o != "env" for o in origin]
        for j, o in enumerate(origin):
            if o == "env" and (j == 0 or origin[j - 1] != "env"):
                assert tokens[j : j + 3] == reply[: len(tokens) - j] and tokens[j - 1] in stops
        with torch.no_grad():  # the policy's tokens after a reply are scored from the continued cache
            logits = model(torch.tensor([prompt + tokens]))[0][0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits.double(), -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
        policy = torch.tensor(mask)
        torch.testing.assert_close(torch.tensor(logprobs, dtype=torch.double)[policy], expected[policy],
                                   atol=1e-4, rtol=0)


def test_env_reply_out_of_range_is_a_clear_error(tiny_pair):
    model, head = tiny_pair
    config = GenerationConfig(max_new_tokens=8, gamma=0, temperature=0, stop_tokens=tuple(range(64)))
    with pytest.raises(ValueError, match="env reply"):
        Engine(model).generate([[1, 2]], config, env=lambda row, tokens, stop: [999])


@pytest.mark.parametrize("gamma", [0, 2])
def test_env_replies_of_different_lengths_at_different_positions(tiny_pair, gamma):
    """A padded multi-row feed reaches max(start) + max(width): past what any one row needs."""
    model, head = tiny_pair
    calls: dict[int, int] = {}

    def env(row: int, tokens: list[int], stop):
        calls[row] = calls.get(row, 0) + 1
        if row == 0:
            return [5, 5]  # row 0 runs ahead: 3 tokens a turn against row 1's 2
        return [5] * (10 if calls[row] >= 18 else 1)  # late in row 0's budget, row 1 sends a long reply

    prompts = [[1] * 40, [2]]
    config = GenerationConfig(max_new_tokens=60, gamma=gamma, seed=0, stop_tokens=tuple(range(64)))
    rollout = Engine(model, head).generate(prompts, config, env=env)
    assert [len(t) for t in rollout.tokens] == [60, 60]
    runs = "".join("e" if o == "env" else "." for o in rollout.origin[1]).split(".")
    assert max(len(r) for r in runs) == 10  # the long reply went in whole


# ---- gamma="auto": a depth chosen per step (bebop.engine.depth) ------------------------------------------------
class _Scripted(DepthController):
    """A depth rule fixed by the test, fed only what earlier steps emitted (as the real controller is)."""

    def __init__(self, max_gamma: int, rule):
        super().__init__(DepthConfig(max_gamma))
        self.rule, self.history = rule, []  # history: (γ, num_accepted per row) of each finished step

    def decide(self, rows: int) -> Choice:
        gamma = self.rule(self.history)
        return Choice(gamma, rows, rows, self.expected_accepted(gamma), None, False)

    def observe(self, rows, gamma, seconds, num_accepted, switch_s=0.0) -> None:
        super().observe(rows, gamma, seconds, num_accepted, switch_s)
        self.history.append((gamma, list(num_accepted)))


def _mostly_accepted(history) -> int:  # adaptive: deep after a step that accepted at least half its drafts
    if not history or history[-1][0] == 0:
        return 1
    gamma, accepted = history[-1]
    return 2 if sum(accepted) >= 0.5 * gamma * len(accepted) else 0


DEPTH_RULES = {"0 then 2": lambda h: (0, 2, 1)[min(len(h), 2)], "2 then 0": lambda h: (2, 0, 1)[min(len(h), 2)],
               "adaptive": _mostly_accepted}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rs", "to"])
def test_a_depth_chosen_per_step_keeps_the_first_three_tokens_exact(method):
    """Depths switched between steps (0 included, and chosen from the previous step's acceptance) draw the first
    three tokens from plain sampling's exact law (chi-square); a wrong law is rejected by the same counts."""
    vocab, n = 5, 24_000
    model, head = near_draft_pair(vocab)
    prompt = [1, 2]
    exact = _exact_first_three(model, prompt, vocab).flatten()
    keep = exact * n >= 5  # chi-square needs expected counts >= 5; pool the rest into one cell
    f_exp = torch.cat([exact[keep], exact[~keep].sum()[None]]) * n
    for name, rule in DEPTH_RULES.items():
        scripted = _Scripted(2, rule)
        engine = Engine(model, head, depth=scripted)
        rollout = engine.generate([prompt] * n, GenerationConfig(max_new_tokens=3, gamma="auto", max_gamma=2,
                                                                 method=method, seed=7))
        chosen = [g for g, _ in scripted.history]
        assert 0 in chosen or name == "adaptive", chosen
        codes = torch.tensor([t[0] * vocab * vocab + t[1] * vocab + t[2] for t in rollout.tokens])
        observed = torch.bincount(codes, minlength=vocab**3).double()
        f_obs = torch.cat([observed[keep], observed[~keep].sum()[None]])
        assert chisquare(f_obs.numpy(), f_exp.numpy()).pvalue > 1e-3, (method, name, chosen)
        wrong = exact.view(vocab, -1)[torch.roll(torch.arange(vocab), 1)].flatten()
        w_exp = torch.cat([wrong[keep], wrong[~keep].sum()[None]]) * n
        assert chisquare(f_obs.numpy(), (w_exp * f_obs.sum() / w_exp.sum()).numpy()).pvalue < 1e-6


def test_auto_depth_at_temperature_zero_is_plain_greedy_decoding(tiny_pair):
    model, head = tiny_pair
    engine = Engine(model, head, depth=_Scripted(3, lambda h: (3, 0, 1, 2)[len(h) % 4]))
    plain = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=16, temperature=0, gamma=0))
    auto = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=16, temperature=0, gamma="auto", max_gamma=3))
    assert auto.tokens == plain.tokens


def _head_state_after_plain_steps(model, head, prompts, steps: int, every_step: bool):
    """Prefill `prompts`, run `steps` plain steps as gamma="auto" runs them (the head's cache left behind), and catch
    the head up: once at the end, or after every step (the upkeep a plain step used to pay)."""
    config = GenerationConfig(max_new_tokens=16, gamma="auto", max_gamma=2, seed=0)
    engine, generator = Engine(model, head), torch.Generator().manual_seed(0)
    out = RolloutBuilder(len(prompts), config)
    batch = engine._new_batch(prompts, config)
    engine._settle(batch, [(i, 0, list(p)) for i, p in enumerate(prompts)], config, generator, out)
    start = batch.draft_cache.lengths.clone()
    assert start.tolist() == [len(p) for p in prompts]
    for k in range(steps):
        engine._step(batch, FixedDepth(0).decide(len(batch.rows)), config, generator, (out, None), {},
                     dict.fromkeys(TIMING, 0.0))
        assert len(batch.head_lag) == (1 if every_step else k + 1)  # the step left the head's cache where it was
        assert batch.draft_cache.lengths.equal(start + (k if every_step else 0))
        if every_step:
            engine.head_cache.catch_up(batch)
    if batch.head_lag:
        engine.head_cache.catch_up(batch)
    return out.tokens, batch


@pytest.mark.parametrize("prompts", [PROMPTS, PROMPTS + PROMPTS[1:2] * 2], ids=["own", "shared"])
def test_the_head_caught_up_after_plain_steps_is_the_head_kept_up_every_step(tiny_pair, prompts):
    """Under gamma="auto" a plain step leaves the head's cache behind; one catch-up over the lag before the next
    draft (keys and values but for its last entry) writes the same entries, draft query and logits as catching up
    after every step. With prompts a group shares too (their entries written once and copied)."""
    with torch.no_grad():
        tokens, lazy = _head_state_after_plain_steps(*tiny_pair, prompts, steps=6, every_step=False)
        same_tokens, kept = _head_state_after_plain_steps(*tiny_pair, prompts, steps=6, every_step=True)
    assert tokens == same_tokens and all(len(t) == 7 for t in tokens)
    assert lazy.draft_cache.lengths.equal(kept.draft_cache.lengths)
    assert lazy.draft_cache.lengths.tolist() == [len(p) + 6 for p in prompts]  # through the last emitted token
    for row, length in enumerate(lazy.draft_cache.lengths.tolist()):
        for a, b in ((lazy.draft_cache.k, kept.draft_cache.k), (lazy.draft_cache.v, kept.draft_cache.v)):
            torch.testing.assert_close(a[:, row, :, :length], b[:, row, :, :length], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lazy.draft_hidden, kept.draft_hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lazy.draft_logits, kept.draft_logits, atol=1e-4, rtol=1e-5)


def test_auto_depth_counters_add_up(tiny_pair):
    model, head = tiny_pair
    scripted = _Scripted(3, lambda h: (3, 0, 1, 2)[len(h) % 4])
    rollout = Engine(model, head, depth=scripted).generate(
        PROMPTS, GenerationConfig(max_new_tokens=20, gamma="auto", max_gamma=3, seed=0))
    s = rollout.stats
    assert sum(s[f"spec/num_gamma_chosen/{g}"] for g in range(4)) == s["num_steps"] == len(scripted.history)
    drafted = [(g, a) for g, a in scripted.history if g > 0]
    assert s["spec/num_drafts"] == sum(len(a) for _, a in drafted)
    assert s["spec/num_draft_tokens"] == sum(g * len(a) for g, a in drafted)
    assert s["spec/num_accepted_tokens"] == sum(sum(a) for _, a in drafted)
    for i in range(3):  # α_i over the drafts that drafted position i and reached it
        reached = sum(n >= i for g, a in drafted if g > i for n in a)
        accepted = sum(n > i for g, a in drafted if g > i for n in a)
        assert s[f"spec/alpha_pos/{i}"] == pytest.approx(accepted / reached)
    cells = {key for key in s if key.startswith("engine/cost/") and key.endswith("/steps")}
    assert sum(s[key] for key in cells) == s["num_steps"]


def _bad_head(config: ModelConfig) -> tuple[Transformer, MTPHead]:
    """A self-draft pair whose head's final norm is negated: q favours what p does not, so drafts are mostly
    rejected while costing what a good head costs."""
    model, head = self_draft_pair(config, logit_std=4.0)
    with torch.no_grad():
        head.norm.weight.neg_()
    return model, head


class _StepCosts(DepthController):
    """The engine's controller with a step-cost model in place of the wall clock, so the decision under test does
    not hang on the load of a shared machine (the benchmarks time real steps): a draft token costs a quarter of a
    plain step; verification is free."""

    def observe(self, rows, gamma, seconds, num_accepted, switch_s=0.0) -> None:
        super().observe(rows, gamma, 1.0 + 0.25 * gamma, num_accepted)  # the model's cost, switching included


def _chosen_after_learning(model, head, prompts, max_new_tokens: int) -> tuple[list[int], int, DepthController]:
    """Steps per depth of a second call, after a first that explored, and how many of them were probes."""
    controller = _StepCosts(DepthConfig(max_gamma=4))
    engine = Engine(model, head, depth=controller)
    config = GenerationConfig(max_new_tokens=max_new_tokens, gamma="auto", max_gamma=4, seed=0)
    engine.generate(prompts, config)  # the controller learns across calls: this one explores every depth
    stats = engine.generate(prompts, replace(config, seed=1)).stats
    return [stats[f"spec/num_gamma_chosen/{g}"] for g in range(5)], stats["spec/num_probe_steps"], controller


def test_auto_depth_picks_plain_decoding_when_drafts_cost_more_than_they_buy():
    chosen, probes, controller = _chosen_after_learning(
        *_bad_head(ModelConfig.tiny(vocab_size=64, num_hidden_layers=2)), PROMPTS, 40)
    assert controller.alphas()[0] < 0.2
    assert chosen[0] >= 0.9 * sum(chosen) and chosen[0] + probes == sum(chosen), chosen  # the rest: probes


def test_auto_depth_drafts_deepest_with_a_perfect_draft_at_few_rows():
    chosen, probes, controller = _chosen_after_learning(
        *self_draft_pair(ModelConfig.tiny(vocab_size=64, num_hidden_layers=2)), [[1, 2]], 60)
    assert controller.alphas()[0] > 0.9
    # The rest: a probe of γ = 3, close behind (it runs a few steps in a row: DepthConfig.probe_steps).
    assert chosen[4] > sum(chosen) / 2 and chosen[4] + probes == sum(chosen), (chosen, probes)


def test_auto_depth_measures_the_depths_it_runs_on_the_real_clock(tiny_pair):
    engine = Engine(*tiny_pair)
    rollout = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=24, gamma="auto", max_gamma=3, seed=0))
    ran = {g for g in range(4) if rollout.stats[f"spec/num_gamma_chosen/{g}"] > 0}
    assert {0, 1} <= ran and {g for _, g in engine.depth.cost_table()} == ran  # plain and γ = 1 first, then more
    assert all(seconds > 0 for seconds in engine.depth.cost_table().values())
    assert rollout.stats["spec/num_probe_steps"] >= 2


def test_auto_depth_errors():
    with pytest.raises(ValueError, match="gamma"):
        GenerationConfig(max_new_tokens=4, gamma="deep")
    with pytest.raises(ValueError, match="max_gamma"):
        GenerationConfig(max_new_tokens=4, gamma="auto", max_gamma=0)
    model, _ = _random_pair(ModelConfig.tiny(vocab_size=64, num_hidden_layers=1))
    with pytest.raises(ValueError, match="needs a draft"):
        Engine(model).generate([[1]], GenerationConfig(max_new_tokens=4, gamma="auto"))
