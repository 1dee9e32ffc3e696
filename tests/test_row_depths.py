"""Each row its own depth and draft source (gamma="rows", bebop.engine.depth.rows): exact through the engine with
ragged depths and mixed sources (chi-square, greedy identity), chosen before the step's randomness, and the
controller's choices on fixed inputs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import bebop.engine.generate as engine_module
from bebop.engine import Engine
from bebop.engine.depth import Choice
from bebop.engine.depth.counters import prediction_split
from bebop.engine.depth.row_costs import RowCosts
from bebop.engine.depth.rows import RowDepths, RowsConfig, RowState
from bebop.engine.rollout import GenerationConfig
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.selfdraft import self_draft_pair
from bebop.models.transformer import Transformer
from exact_law import check_first_three, first_three_law, near_draft_pair

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15], [1, 2, 1, 2, 1, 2], [3, 3]]


class Scripted:
    """A per-row depth that scripts each row's depth and source from the step count and the row's position (the
    engine asks it as it asks RowDepths), recording when it was asked."""

    per_row = True

    def __init__(self, max_gamma: int, rule, lookup: bool = True):
        self.config = RowsConfig(max_gamma, lookup=lookup)
        self.max_gamma, self.rule, self.steps, self.events = max_gamma, rule, 0, []

    def decide(self, rows: int, states: list[RowState]) -> Choice:
        assert len(states) == rows
        picks = [self.rule(self.steps, b) for b in range(rows)]  # (depth, lookup) per row
        depths, looked = [d for d, _ in picks], [flag and d > 0 for d, flag in picks]
        self.steps += 1
        self.events.append("decide")
        return Choice(max(depths), rows, rows, None, None, False, depths=tuple(depths), lookup=tuple(looked),
                      budget=rows + sum(depths))

    def observe(self, rows, gamma, seconds, num_accepted, switch_s=0.0, draft_s=0.0) -> None:
        self.events.append("observe")


RULES = {"ragged": lambda t, b: ((b + t) % 3, False),
         "ragged with lookup": lambda t, b: ((b + 2 * t) % 3, b % 4 == 1),
         "lookup and plain": lambda t, b: (2 * ((b + t) % 2), b % 2 == 0)}


@pytest.fixture(scope="module")
def tiny_pair():
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=64, num_hidden_layers=2)
    return Transformer(config).eval(), MTPHead(config).eval()


@pytest.mark.parametrize("rule", list(RULES))
def test_greedy_decoding_with_ragged_depths_and_sources_is_plain_greedy_decoding(tiny_pair, rule):
    engine = Engine(*tiny_pair)
    plain = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=16, temperature=0, gamma=0))
    scripted = Engine(*tiny_pair, depth=Scripted(2, RULES[rule]))
    for method in ("rs", "to", "greedy"):
        spec = scripted.generate(PROMPTS, GenerationConfig(max_new_tokens=16, temperature=0, gamma="rows",
                                                           max_gamma=2, method=method))
        assert spec.tokens == plain.tokens, (rule, method)
    controlled = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=16, temperature=0, gamma="rows"))
    assert controlled.tokens == plain.tokens


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rs", "to"])
def test_ragged_depths_and_sources_draw_the_first_three_tokens_exactly(method):
    """20,000 rows of one prompt, each at its own scripted depth per step (0, 1 or 2; some drafting by prompt lookup
    beside the head): the first three tokens pass a chi-square test against plain sampling's enumerated law, and the
    same counts fail it against a wrong law."""
    vocab, n, prompt = 5, 20_000, [1, 2, 1]
    model, head = near_draft_pair(vocab)
    law = first_three_law(model, prompt, vocab)
    for name, rule in RULES.items():
        engine = Engine(model, head, depth=Scripted(2, rule))
        rollout = engine.generate([prompt] * n, GenerationConfig(max_new_tokens=3, gamma="rows", max_gamma=2,
                                                                 method=method, seed=11))
        check_first_three(rollout.tokens, law, vocab)
        assert 0.05 < rollout.stats["spec/acceptance_rate"] < 0.95, name


def test_depths_are_chosen_before_the_steps_randomness(tiny_pair, monkeypatch):
    """Every step's depths are decided before its uniforms are drawn, and the decision sees only RowStates built from
    what the rows emitted: the same rows' states give the same depths whatever the step's draws."""
    scripted = Scripted(2, RULES["ragged with lookup"])
    real = engine_module.draw_uniforms

    def spy(*args):
        scripted.events.append("draw")
        return real(*args)
    monkeypatch.setattr(engine_module, "draw_uniforms", spy)
    Engine(*tiny_pair, depth=scripted).generate(PROMPTS, GenerationConfig(max_new_tokens=8, gamma="rows", max_gamma=2,
                                                                          seed=0))
    steps = [scripted.events[i:i + 3] for i in range(0, len(scripted.events), 3)]
    assert steps and all(step == ["decide", "draw", "observe"] for step in steps), scripted.events[:9]
    controller = RowDepths(RowsConfig(3))
    states = [RowState(0.1, 0), RowState(2.5, 0), RowState(0.4, 3)]
    _price(controller.costs, 3, plain=1.0, per_draft=0.05)
    first = controller.decide(3, states)
    controller._last = None  # (no step ran: a second decision from the same state)
    assert controller.decide(3, states) == first


def _price(costs: RowCosts, rows: int, *, plain: float, per_draft: float, deep: float = 0.0) -> None:
    """Teach `costs` a bucket's prices: plain steps of `plain` s, drafting steps of plain + per_draft·M + deep·G
    (deep·G of them drafting)."""
    for _ in range(3):
        costs.observe(rows, rows, rows, 0, plain, 0.0)
    for m, g in [(rows, 1), (2 * rows, 2), (3 * rows, 3), (rows + 1, 2), (2, 1)] * 8:
        costs.observe(rows, rows, rows + m, g, plain + per_draft * m + deep * g, deep * g)


def _taught(accept_low: float, accept_high: float, k: int = 3) -> RowDepths:
    """A controller whose head law has learnt that rows at H = 0.2 accept `accept_high` of their drafts and rows at
    H = 2.0 `accept_low`, at every position."""
    controller = RowDepths(RowsConfig(k, lookup=False, probe_budget=0))
    for _ in range(200):
        for entropy, rate in ((0.2, accept_high), (2.0, accept_low)):
            accepted = round(rate * 10)
            for n in [k] * accepted + [0] * (10 - accepted):
                controller.head_law.observe(entropy, k, n)
    return controller


def test_confident_rows_draft_deeper_and_uncertain_ones_decode_plainly():
    controller = _taught(accept_low=0.05, accept_high=0.9)
    _price(controller.costs, 4, plain=1.0, per_draft=0.05)
    choice = controller.decide(4, [RowState(0.2), RowState(2.0), RowState(0.2), RowState(2.0)])
    assert choice.depths[0] == choice.depths[2] == 3 and choice.depths[1] == choice.depths[3] == 0
    assert choice.budget == 4 + 6 and choice.lookup == (False,) * 4


def test_dear_verification_shrinks_the_budget_and_never_picks_what_the_model_says_loses():
    controller = _taught(accept_low=0.5, accept_high=0.6)
    _price(controller.costs, 8, plain=1.0, per_draft=0.3)  # a verified draft costs 0.3 of a whole plain step
    choice = controller.decide(8, [RowState(0.2)] * 8)
    price = controller.costs.pricer(8, 8)
    assert choice.budget == 8 and choice.gamma == 0  # no budget pays: plain decoding
    cheap = _taught(accept_low=0.5, accept_high=0.6)
    _price(cheap.costs, 8, plain=1.0, per_draft=0.01)
    drafted = cheap.decide(8, [RowState(0.2)] * 8)
    assert drafted.budget > 8
    # the chosen budget's predicted tokens/s beat plain decoding's by the margin
    gain = (8 + drafted.expected_accepted * 8) / drafted.cost_s
    assert gain >= 8 / cheap.costs.price(8, 8, 0, 0) * (1 + cheap.config.margin)
    assert price(0, 0) == pytest.approx(1.0)


def test_rows_with_a_long_match_draft_by_lookup_where_it_accepts_more():
    controller = RowDepths(RowsConfig(2, probe_budget=0))
    for _ in range(100):
        controller.head_law.observe(1.0, 2, 0)  # the head's drafts are all rejected here
        controller.lookup_law.observe(3.0, 2, 2)  # lookup's, on a 3-token match, all accepted
    _price(controller.costs, 2, plain=1.0, per_draft=0.02)
    choice = controller.decide(2, [RowState(1.0, match=3), RowState(1.0, match=0)])
    assert choice.lookup == (True, False) and choice.depths == (2, 0)


def test_a_new_bucket_measures_plain_then_drafting_first():
    controller = RowDepths(RowsConfig(2))
    states = [RowState(0.5)] * 3
    seen = []
    for _ in range(4):
        choice = controller.decide(3, states)
        seen.append(choice.depths)
        controller.observe(3, choice.gamma, 1.0 + 0.1 * sum(choice.depths), [0] * 3)
    assert seen[:2] == [(0, 0, 0), (0, 0, 0)] and sum(seen[2]) > 0  # then its best budget


class _ModelCosts(RowDepths):
    """The per-row controller with a step-cost model in place of the wall clock (the decisions under test must not
    hang on a shared machine's load): a plain step costs 1, each verified draft 0.02 more and each draft position
    0.1 (drafting)."""

    def observe(self, rows, gamma, seconds, num_accepted, switch_s=0.0, draft_s=0.0) -> None:
        _, depths, _ = self._last
        drafting = 0.1 * max(depths)
        super().observe(rows, gamma, 1.0 + 0.02 * sum(depths) + drafting, num_accepted, 0.0, drafting)


def _row_steps_after_learning(model, head, prompts, tokens: int, lookup: bool = True) -> dict[int, int]:
    controller = _ModelCosts(RowsConfig(3, lookup=lookup))
    engine = Engine(model, head, depth=controller)
    config = GenerationConfig(max_new_tokens=tokens, gamma="rows", max_gamma=3, seed=0)
    engine.generate(prompts, config)  # learns across calls: this one explores
    stats = engine.generate(prompts, GenerationConfig(max_new_tokens=tokens, gamma="rows", max_gamma=3, seed=1)).stats
    return {d: stats[f"spec/num_row_depth/{d}"] for d in range(4)}


def test_a_perfect_draft_is_drafted_deep_and_a_useless_one_not_at_all():
    config = ModelConfig.tiny(vocab_size=64, num_hidden_layers=2)
    perfect = _row_steps_after_learning(*self_draft_pair(config), PROMPTS, 24)
    assert perfect[3] > 0.8 * sum(perfect.values()), perfect
    model, head = self_draft_pair(config, logit_std=4.0)
    with torch.no_grad():
        head.norm.weight.neg_()  # q favours what p does not: drafts are rejected, and cost what good ones do
    useless = _row_steps_after_learning(model, head, PROMPTS, 24, lookup=False)  # (lookup's drafts would pay here)
    assert useless[0] > 0.9 * sum(useless.values()), useless


def test_a_row_never_drafts_past_what_its_budget_can_take():
    controller = _taught(accept_low=0.9, accept_high=0.9)
    _price(controller.costs, 3, plain=1.0, per_draft=0.001)
    choice = controller.decide(3, [RowState(0.2, left=1), RowState(0.2, left=3), RowState(0.2, left=40)])
    assert choice.depths == (0, 2, 3)  # a step emits up to its depth + 1 tokens; tokens past the budget are cut


class Priced(Scripted):
    """`Scripted` with a cost model's price on every step: each row expects half a draft accepted, a step costs
    1 ms and a plain step 2 ms, so every step counts in the priced-step counters; no row drafts past its budget
    (as RowDepths does)."""

    def decide(self, rows: int, states: list[RowState]) -> Choice:
        choice = super().decide(rows, states)
        depths = tuple(min(d, state.left - 1) for d, state in zip(choice.depths, states))
        return replace(choice, gamma=max(depths), depths=depths, budget=rows + sum(depths), expected_accepted=0.5,
                       cost_s=1e-3, plain_s=2e-3)


def test_the_priced_steps_count_the_tokens_they_emitted_and_the_prediction_split_multiplies_out(tiny_pair):
    """Every token after the prefill's first is emitted by a priced step: `measured_tokens` counts them all; the
    split's factors are the counters' ratios and multiply out to the priced steps' measured speedup."""
    model, head = tiny_pair
    config = GenerationConfig(max_new_tokens=12, gamma="rows", max_gamma=2, seed=0)  # no stop tokens
    every_third_plain = lambda t, b: (0 if t % 3 == 0 else 1 + (b + t) % 2, False)  # noqa: E731
    rollout = Engine(model, head, depth=Priced(2, every_third_plain, lookup=False)).generate(PROMPTS, config)
    s, key = rollout.stats, "engine/priced_steps/{}".format
    assert s[key("measured_tokens")] == s["num_generated_tokens"] - len(PROMPTS)  # the prefill drew each row's first
    assert s[key("measured_tokens")] == s[key("rows")] + s["spec/num_accepted_tokens"]
    assert s[key("predicted_tokens")] == pytest.approx(1.5 * s[key("rows")])
    plain = {"wall_time_s": 3.0, "engine/prefill_s": 1.0, "num_generated_tokens": 2 * s["num_generated_tokens"]}
    split = prediction_split(s, plain)
    assert split["predicted"] == pytest.approx(1.5 / 1e-3 / (1 / 2e-3))
    assert split["tokens"] == pytest.approx(s[key("measured_tokens")] / s[key("predicted_tokens")])
    assert split["seconds"] == pytest.approx(1e-3 * s["engine/num_steps"] / s[key("measured_s")])
    measured = s[key("measured_tokens")] / s[key("measured_s")]
    assert split["priced"] == pytest.approx(measured / (s[key("rows")] / s[key("plain_s")]))
    loop = s["wall_time_s"] - s["engine/prefill_s"]
    assert split["loop"] == pytest.approx(1.0 / loop)  # per token: the plain run made twice the tokens
    assert split["outside"] == pytest.approx(1 - s[key("measured_s")] / loop)
    assert 0 < s["engine/catch_up_s"] <= s["engine/draft_s"]  # the head catches up after each plain step
    assert split["catch_up"] == pytest.approx(s["engine/catch_up_s"] / loop)
    assert split["priced"] * (1 - split["outside"]) * split["rest"] == pytest.approx(split["loop"])
    assert split["call"] == pytest.approx(1.5 / s["wall_time_s"])
    assert prediction_split({}) is None  # nothing priced
