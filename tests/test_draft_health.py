"""bebop.rl.draft_health: the entropy law's residual per RL step, and its alarm when a head goes bad mid-run."""

from __future__ import annotations

import pytest
import torch

from bebop.data.tokenizer import CharTokenizer
from bebop.metrics import SpecCounters
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer
from bebop.rl import RLConfig, Trainer, build_trainer
from bebop.rl.draft_health import DraftHealth, HealthConfig, replay
from bebop.runlog import load_run


def _step_counters(generator: torch.Generator, *, entropy_shift: float = 0.0, mismatch: float = 0.0,
                   drafts: int = 64) -> dict:
    """One RL step's counters from a draft that follows the law α = 0.9 - 0.3·H (minus `mismatch`) at γ = 3."""
    h = 0.2 + 1.6 * torch.rand(drafts, 3, generator=generator, dtype=torch.float64) + entropy_shift  # [B, γ]
    alpha = (0.9 - 0.3 * h - mismatch).clamp(0, 1)  # [B, γ]
    passed = torch.rand(drafts, 3, generator=generator, dtype=torch.float64) < alpha
    counters = SpecCounters(gamma=3)
    counters.update(passed.long().cumprod(-1).sum(-1), h)
    return counters.to_dict()


def test_healthy_steps_stay_inside_and_entropy_moves_are_explained():
    generator, health = torch.Generator().manual_seed(0), DraftHealth(HealthConfig(fit_steps=4))
    fitting = [health.check(_step_counters(generator)) for _ in range(4)]
    assert fitting == [{}] * 4 and health.fit is not None
    assert health.fit.slope == pytest.approx(-0.3, abs=0.1)
    healthy = [health.check(_step_counters(generator)) for _ in range(20)]
    # The entropy rises 0.3 nats: acceptance falls 0.09, all of it predicted by the law (the entropy term).
    hotter = [health.check(_step_counters(generator, entropy_shift=0.3)) for _ in range(10)]
    assert sum(r["draft_health/alarm"] for r in healthy + hotter) == 0  # a 99% interval that must clear 0.05
    assert sum(r["draft_health/entropy_part"] for r in hotter) / 10 == pytest.approx(-0.09, abs=0.03)
    assert all(abs(r["draft_health/mismatch_part"]) < 0.1 for r in hotter)


def _fitted(seed: int) -> tuple[torch.Generator, DraftHealth]:
    generator, health = torch.Generator().manual_seed(seed), DraftHealth(HealthConfig(fit_steps=4))
    for _ in range(4):
        health.check(_step_counters(generator))
    return generator, health


def test_a_draft_that_parts_from_the_policy_raises_the_alarm_by_its_sign_and_names_the_mismatch_term():
    """Below the law: a stale or broken head. Above it: the law is stale (the policy sharpened), never the head's
    fault. Either only once a stretch of steps (`min_window`) sits off the law, never on one step alone."""
    generator, health = _fitted(1)
    lone = health.check(_step_counters(generator, mismatch=0.4))  # one step far below: no stretch yet
    assert lone["draft_health/alarm"] == 0.0 and lone["draft_health/residual"] < -0.25
    bad = [health.check(_step_counters(generator, mismatch=0.4)) for _ in range(2)][-1]
    assert "mismatch term" in bad["draft_health/warning"] and "below the entropy law" in bad["draft_health/warning"]
    assert bad["draft_health/alarm"] == 1.0 and bad["draft_health/residual_hi"] < -0.05
    assert bad["draft_health/mismatch_part"] < -0.25 and abs(bad["draft_health/entropy_part"]) < 0.05
    assert "stale or broken head" in bad["draft_health/warning"]
    generator, health = _fitted(4)
    better = [health.check(_step_counters(generator, mismatch=-0.3)) for _ in range(3)][-1]  # accepts more than the law
    assert better["draft_health/alarm"] == 1.0 and better["draft_health/residual_lo"] > 0.05
    assert "the law is stale" in better["draft_health/warning"] and "broken" not in better["draft_health/warning"]


def test_no_alarm_on_noise_a_bootstrap_over_steps_would_not_call():
    """Healthy steps with a few drafts each (their acceptance noisy, a lone one far off the line) and a small steady
    drift (0.03, what a moving policy does to any law fitted on its first steps) never raise the alarm; the window's
    interval holds the mean residual."""
    generator, health = _fitted(5)
    noisy = [health.check(_step_counters(generator, drafts=6)) for _ in range(30)]
    drift = [health.check(_step_counters(generator, mismatch=-0.03)) for _ in range(15)]
    assert sum(r["draft_health/alarm"] for r in noisy + drift) == 0
    assert max(abs(r["draft_health/residual"]) for r in noisy) > 0.2  # single steps do stray far
    assert all(r["draft_health/residual_lo"] <= r["draft_health/window_residual"] <= r["draft_health/residual_hi"]
               for r in noisy[2:] + drift)


def test_replay_runs_the_monitor_over_a_runs_records():
    generator = torch.Generator().manual_seed(6)
    records = [_step_counters(generator) for _ in range(6)]
    records += [_step_counters(generator, mismatch=0.4) for _ in range(4)]
    replayed = replay([{**r, "absent": float("nan")} for r in records])
    assert replayed[:4] == [{}] * 4 and replayed[-1]["draft_health/alarm"] == 1.0
    generator, health = torch.Generator().manual_seed(6), DraftHealth()
    assert [health.check(_step_counters(generator)) for _ in range(6)][-1] == replayed[5]


def _vllm_step_counters(generator: torch.Generator, *, entropy_shift: float = 0.0, mismatch: float = 0.0,
                        drafts: int = 64) -> dict:
    """The same draft as `_step_counters`, counted as vLLM counts it (per draft position, no entropy bins), with the
    step's mean policy entropy the trainer logs beside it."""
    h = 0.2 + 1.6 * torch.rand(drafts, 3, generator=generator, dtype=torch.float64) + entropy_shift  # [B, γ]
    alpha = (0.9 - 0.3 * h - mismatch).clamp(0, 1)  # [B, γ]
    num_accepted = (torch.rand(drafts, 3, generator=generator, dtype=torch.float64) < alpha).long().cumprod(-1).sum(-1)
    per_pos = {f"spec/num_accepted_tokens_per_pos/{i}": int((num_accepted > i).sum()) for i in range(3)}
    return {"spec/gamma": 3, "spec/method": "rs", "spec/num_drafts": drafts, "spec/num_draft_tokens": 3 * drafts,
            "spec/num_accepted_tokens": int(num_accepted.sum()), **per_pos, "actor/entropy": float(h.mean())}


def test_vllm_counters_without_entropy_bins_get_the_same_alarm():
    """vLLM counts drafts per position, not per entropy bin: each step is one point at its mean entropy. Steps at one
    entropy fit a flat law and stay inside; a draft that parts from the policy raises the alarm."""
    generator, health = torch.Generator().manual_seed(2), DraftHealth(HealthConfig(fit_steps=4))
    assert [health.check(_vllm_step_counters(generator)) for _ in range(4)] == [{}] * 4
    assert health.fit.slope == 0.0  # four steps' mean entropies span far less than a bin: no slope from them
    healthy = [health.check(_vllm_step_counters(generator)) for _ in range(20)]
    assert sum(r["draft_health/alarm"] for r in healthy) == 0
    # the mean residual's standard error: the reference's (4 x 64 drafts) and the 20 steps' (binomial), ~0.033
    assert abs(sum(r["draft_health/residual"] for r in healthy) / 20) < 0.1
    bad = [health.check(_vllm_step_counters(generator, mismatch=0.4)) for _ in range(5)][-1]  # a stretch of them
    assert "mismatch term" in bad["draft_health/warning"]
    assert bad["draft_health/alarm"] == 1.0 and bad["draft_health/mismatch_part"] < -0.25


def test_vllm_steps_spread_over_entropy_fit_the_law_and_explain_an_entropy_move():
    generator, health = torch.Generator().manual_seed(3), DraftHealth(HealthConfig(fit_steps=6))
    for shift in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):  # the steps' mean entropies span 1 nat
        health.check(_vllm_step_counters(generator, entropy_shift=shift, drafts=256))
    assert health.fit.slope == pytest.approx(-0.3, abs=0.1)
    hotter = [health.check(_vllm_step_counters(generator, entropy_shift=0.9, drafts=256)) for _ in range(10)]
    assert sum(r["draft_health/alarm"] for r in hotter) == 0
    assert all(abs(r["draft_health/mismatch_part"]) < 0.1 for r in hotter)


def test_steps_without_drafts_are_skipped():
    health = DraftHealth()
    assert health.check({"spec/gamma": 3, "spec/method": "rs", "spec/num_drafts": 0}) == {}
    assert health.check({"loss": 1.0}) == {}
    with pytest.raises(ValueError, match="fit_steps"):
        HealthConfig(fit_steps=0)
    with pytest.raises(ValueError, match="min_window"):
        HealthConfig(window=2, min_window=3)


def randomised(head: torch.nn.Module) -> torch.nn.Module:
    """`head` with random weights, N(0, 30²) seeded per parameter: a draft after a weight sync gone wrong (also used by
    tests/health_push_worker.py)."""
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 30.0, generator=torch.Generator().manual_seed(p.numel()))
    return head


CORRUPT_AT = 4  # the step whose update corrupts the draft


def corrupting(trainer: Trainer, at: int = CORRUPT_AT) -> Trainer:
    """`trainer` with the draft its engine runs (the rollout backend's snapshot of the head) randomised in the update
    of step `at`: the rollouts of the steps after it draft with the corrupted head, as after a weight sync gone wrong."""
    update, updates = trainer.update, []

    def corrupt_after(batch):
        result = update(batch)
        updates.append(1)
        if len(updates) == at + 1:
            randomised(trainer.rollouts.backend.head)
        return result

    trainer.update = corrupt_after
    return trainer


def test_a_head_corrupted_mid_run_is_flagged_after_the_corruption_and_not_before(tmp_path, capsys):
    from test_rl import MODEL, Digits

    tok = CharTokenizer()
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=tok.vocab_size, **MODEL)
    model, head = Transformer(config), MTPHead(config)
    rl = RLConfig.tiny(steps=CORRUPT_AT + 2 + HealthConfig().window, prompts_per_step=4, group_size=4,
                       max_new_tokens=24, mode="sync", lr=1e-3)
    records = corrupting(build_trainer(rl, model, tok, head=head, run_dir=tmp_path / "run", task=Digits())).run()
    fitted = HealthConfig().fit_steps
    alarms = [r.get("draft_health/alarm") for r in records]
    assert alarms[:fitted] == [None] * fitted  # the law is being fitted
    assert alarms[fitted:CORRUPT_AT + 1] == [0.0] * (CORRUPT_AT + 1 - fitted), alarms
    # raised once the window holds a stretch of bad steps (at most `window` after the corruption), and kept
    first = alarms.index(1.0)
    assert CORRUPT_AT + 1 <= first <= CORRUPT_AT + HealthConfig().window and all(a == 1.0 for a in alarms[first:])
    after = records[first]
    assert "mismatch term" in after["draft_health/warning"]
    assert records[CORRUPT_AT + 1]["draft_health/measured"] < records[CORRUPT_AT]["draft_health/measured"] - 0.3
    # The run's warnings: the alarm once, where it started (the train stream holds every alarmed step), on stderr once
    warned = load_run(tmp_path / "run").streams["warnings"].to_dict("records")
    assert [(w["step"], w["source"]) for w in warned] == [(first, "draft_health")]
    assert warned[0]["message"] == after["draft_health/warning"]
    assert capsys.readouterr().err.count("mismatch term") == 1
