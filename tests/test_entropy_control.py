"""The GRPO entropy knob (bebop.rl.entropy_control, RLConfig.entropy_*): TRL's adaptive rule, its state through a
checkpoint, the bonus moving a policy's entropy, the knob off leaving a run as it was, the command line."""

import argparse
import math

import pytest
import torch
from test_rl import MODEL, Digits

from bebop.commands.rl import add_arguments, config_from_args
from bebop.data.tokenizer import CharTokenizer
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer
from bebop.rl import RLConfig, build_trainer
from bebop.rl import trainer as trainer_module
from bebop.rl.entropy_control import EntropyControl, adapt_coefficient


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer()


@pytest.fixture(scope="module")
def pair(tok):
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=tok.vocab_size, **MODEL)
    return Transformer(config), MTPHead(config)


@pytest.fixture(scope="module")
def peaked(pair):
    """The policy with its LM head scaled 8x: entropy ~0.03 nats, so every completion of a group is the same, GRPO
    has no signal (all advantages 0) and leaves the policy exactly as it is; only an entropy bonus moves it."""
    model = Transformer(pair[0].config)
    model.load_state_dict(pair[0].state_dict())
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


# ------------------------------------------------------------------------------------------------- the rule
def test_the_adaptive_rule_steps_up_at_or_below_the_target_and_down_above_within_its_bounds():
    assert adapt_coefficient(0.1, 0.3, 0.5, delta=0.01) == pytest.approx(0.11)
    assert adapt_coefficient(0.1, 0.5, 0.5, delta=0.01) == pytest.approx(0.11)  # at the target: up (TRL's ≤)
    assert adapt_coefficient(0.1, 0.7, 0.5, delta=0.01) == pytest.approx(0.09)
    assert adapt_coefficient(0.995, 0.1, 0.5, high=1.0) == 1.0 and adapt_coefficient(0.003, 0.9, 0.5, low=0.0) == 0.0
    control = EntropyControl(coef=0.0, target=0.5, high=0.012, delta=0.005)
    applied = []
    for entropy in (0.2, 0.2, 0.2, 0.2, 0.9, 0.9, 0.9, 0.9):
        applied.append(control.coefficient)
        control.observe(entropy)
    # nothing before a measurement; then up by δ to the cap; above the target nothing applied while c falls to 0
    assert applied == pytest.approx([0.0, 0.005, 0.010, 0.012, 0.012, 0.0, 0.0, 0.0])
    assert control.coef == 0.0 and control.state_dict() == {"coef": 0.0, "last_entropy": 0.9}
    static = EntropyControl(coef=0.02)
    static.observe(9.0)
    assert static.coefficient == 0.02 and static.active and not static.adaptive and not EntropyControl().active


def test_the_controls_state_round_trips_and_an_earlier_checkpoint_keeps_the_start():
    control = EntropyControl(coef=0.05, target=1.0)
    control.observe(0.4)
    restored = EntropyControl(coef=0.05, target=1.0)
    restored.load_state_dict(control.state_dict())
    assert (restored.coef, restored.last_entropy, restored.coefficient) == (0.055, 0.4, 0.055)
    fresh = EntropyControl(coef=0.05, target=1.0)
    fresh.load_state_dict(None)  # a checkpoint from before the knob: the run had none
    assert fresh.coefficient == 0.0 and math.isinf(fresh.last_entropy)


# --------------------------------------------------------------------------------------------- through a run
def entropies(model, tok, tmp_path, name, **overrides):
    config = RLConfig.tiny(**{"steps": 4, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 16, "lr": 1e-2,
                              "mode": "sync", "rollout": "none", **overrides})
    records = build_trainer(config, model, tok, run_dir=tmp_path / name, task=Digits()).run()
    return records


def test_a_positive_coefficient_raises_the_policys_entropy_where_zero_leaves_it(peaked, tok, tmp_path):
    """Measured over seeds 0-3 (mean rollout entropy of steps 1-3): coefficient 0 stays at 0.029-0.030 nats, 0.02 rises
    to 0.63-2.67 (Adam makes the step size the learning rate's whatever the coefficient). The bar, 0.2 nats, is a
    third of the smallest rise."""
    still = [r["actor/entropy"] for r in entropies(peaked, tok, tmp_path, "zero")]
    moved = [r["actor/entropy"] for r in entropies(peaked, tok, tmp_path, "bonus", entropy_coef=0.02)]
    assert moved[0] == still[0]  # the same first rollouts: the bonus acts from the first update on
    assert sum(moved[1:]) / 3 > sum(still[1:]) / 3 + 0.2, (still, moved)
    assert max(still) - min(still) < 0.01  # without a bonus nothing moves it (the control is a control)


def test_adaptive_runs_log_the_applied_coefficient_beside_an_online_head(pair, tok, tmp_path):
    """Async, RS rollouts, an online head: a target above the entropy steps the coefficient up to its cap, one below
    it applies nothing and lets the coefficient fall to its floor."""
    model, head = pair
    common = dict(steps=4, prompts_per_step=2, group_size=2, max_new_tokens=12, method="rs", mtp="online-tv",
                  mode="async", entropy_coef=0.01, entropy_coef_delta=0.004, entropy_coef_max=0.02)
    up = build_trainer(RLConfig.tiny(**common, entropy_target=50.0), model, tok, head=head, run_dir=tmp_path / "up",
                       task=Digits()).run()
    down = build_trainer(RLConfig.tiny(**common, entropy_target=0.0), model, tok, head=head,
                         run_dir=tmp_path / "down", task=Digits()).run()
    assert [r["actor/entropy_coef"] for r in up] == pytest.approx([0.0, 0.014, 0.018, 0.02])
    assert [r["actor/entropy_coef_next"] for r in up] == pytest.approx([0.014, 0.018, 0.02, 0.02])
    assert [r["actor/entropy_coef"] for r in down] == [0.0] * 4
    assert [r["actor/entropy_coef_next"] for r in down] == pytest.approx([0.006, 0.002, 0.0, 0.0])
    for r in up:
        assert r["mtp/online_update"] == 1 and r["actor/entropy_current"] > 0
        assert r["actor/entropy_bonus"] == pytest.approx(r["actor/entropy_coef"] * r["actor/entropy_current"])


def test_resume_reproduces_the_adaptive_coefficient(peaked, tok, tmp_path):
    config = RLConfig.tiny(steps=5, prompts_per_step=2, group_size=2, max_new_tokens=12, lr=1e-2, mode="sync",
                           method="none", entropy_target=1.0, entropy_coef_delta=0.01)
    whole = build_trainer(config, peaked, tok, run_dir=tmp_path / "whole", task=Digits()).run()
    build_trainer(config.replace(steps=3), peaked, tok, run_dir=tmp_path / "split", task=Digits()).run()
    resumed = build_trainer(config, peaked, tok, run_dir=tmp_path / "split", task=Digits(), resume=True).run()
    assert [r["step"] for r in resumed] == [3, 4]
    for key in ("actor/entropy_coef", "actor/entropy_coef_next"):
        assert [r[key] for r in resumed] == pytest.approx([r[key] for r in whole[3:]], abs=1e-12), key
    assert whole[3]["actor/entropy_coef"] == pytest.approx(0.03)  # three steps at or below the target: 3δ
    current = [r["actor/entropy_current"] for r in whole[3:]]
    assert [r["actor/entropy_current"] for r in resumed] == pytest.approx(current)


def test_with_the_knob_off_the_update_computes_no_entropy_and_logs_no_new_field(pair, tok, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("token_entropy called with the knob off")

    monkeypatch.setattr(trainer_module, "token_entropy", refuse)
    records = entropies(pair[0], tok, tmp_path, "off", steps=2)
    assert not [k for r in records for k in r if k.startswith("actor/entropy_")]


# ------------------------------------------------------------------------------------------ config and flags
def test_cli_entropy_flags_reach_the_config_and_misuse_is_one_line():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parse = lambda *argv: config_from_args(parser.parse_args(["--out", "x", *argv]))  # noqa: E731
    config = parse("--entropy-coef", "0.01", "--entropy-target", "0.6", "--entropy-coef-delta", "0.002",
                   "--entropy-coef-max", "0.1")
    assert (config.entropy_coef, config.entropy_target, config.entropy_coef_delta, config.entropy_coef_max) == (
        0.01, 0.6, 0.002, 0.1)
    assert parse().entropy_coef == 0.0 and parse().entropy_target is None
    assert parse("--entropy-coef", "-0.01").entropy_coef == -0.01  # a static penalty sharpens the policy
    with pytest.raises(ValueError, match="pass --entropy-target too"):
        parse("--entropy-coef-delta", "0.01")
    for argv, match in ((("--entropy-target", "-1"), "entropy_target"), (("--entropy-coef", "nan"), "entropy_coef"),
                        (("--entropy-target", "1", "--entropy-coef", "2"), "entropy_coef must be in"),
                        (("--entropy-target", "1", "--entropy-coef-min", "-0.1"), "entropy_coef_min"),
                        (("--entropy-target", "1", "--entropy-coef-delta", "0"), "entropy_coef_delta")):
        with pytest.raises(ValueError, match=match):
            parse(*argv)


def test_a_run_saved_before_the_knobs_resumes_with_them_off():
    from bebop.runlog.session import config_changes

    config = RLConfig.tiny()
    saved = {k: v for k, v in config.to_dict().items() if not k.startswith("entropy_") and k != "shadow_heads"}
    assert config_changes(saved, config, RLConfig.RESUMABLE) == ({}, {})  # fields it predates read as their defaults
    assert config_changes(saved, config.replace(entropy_coef=0.1), RLConfig.RESUMABLE)[1] == {"entropy_coef": (0.0, 0.1)}
