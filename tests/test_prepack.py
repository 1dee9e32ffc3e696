"""bebop.models.prepack: packed oneDNN weights give the plain linear's results, follow in-place updates, and stay out
of everything but CPU bf16 eager inference; on a CPU where oneDNN cannot pack bf16 (AVX2 without AVX-512, emulated
here with ONEDNN_MAX_CPU_ISA=AVX2) or with BEBOP_CPU_BF16_PACKING=0, bf16 runs unpacked with the same results."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import bebop.models.prepack as prepack
from bebop.device import PACKING_SWITCH, cpu_bf16_packing, onednn_bf16_works
from bebop.engine import Engine
from bebop.engine.rollout import GenerationConfig
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.prepack import Linear, is_packed, prepacked
from bebop.models.transformer import Transformer

needs_packing = pytest.mark.skipif(not cpu_bf16_packing(), reason="oneDNN cannot pack bf16 on this CPU, or "
                                   f"{PACKING_SWITCH}=0: the unpacked path is what runs (tested below)")


def bf16_pair():
    model = Transformer(ModelConfig.tiny()).to(torch.bfloat16).eval()
    return model, MTPHead(model.config).to(torch.bfloat16).eval()


def linears(*modules):
    return [m for module in modules for m in module.modules() if isinstance(m, Linear)]


@needs_packing
def test_inside_the_block_every_linear_uses_a_packed_weight_with_the_plain_results():
    model, head = bf16_pair()
    tokens = torch.randint(0, model.config.vocab_size, (3, 7))
    with torch.inference_mode():
        check_packed_matches_plain(model, head, tokens)


def check_packed_matches_plain(model, head, tokens):
    plain_logits, hidden = model(tokens)
    plain_draft = head.logits(model, hidden)
    with prepacked(model, head):
        assert all(is_packed(m) for m in linears(model, head))
        packed_logits, packed_hidden = model(tokens)
        packed_draft = head.logits(model, packed_hidden)
    assert all(not is_packed(m) for m in linears(model, head))
    torch.testing.assert_close(packed_logits, plain_logits)
    torch.testing.assert_close(packed_draft, plain_draft)


@needs_packing
def test_the_forward_reads_the_packed_weight():
    model, _ = bf16_pair()
    tokens = torch.randint(0, model.config.vocab_size, (2, 5))
    with torch.inference_mode(), prepacked(model):
        prepack._ACTIVE[model.lm_head] = torch.ops.mkldnn._reorder_linear_weight(torch.zeros_like(model.lm_head.weight))
        logits, _ = model(tokens)
    assert logits.abs().max() == 0  # the packed copy, not the module's weight, made these logits


@needs_packing
def test_a_packing_is_reused_until_the_weight_changes_in_place():
    model, _ = bf16_pair()
    tokens = torch.randint(0, model.config.vocab_size, (2, 5))
    with torch.inference_mode():
        check_update_is_seen(model, tokens, reused=True)


@needs_packing
def test_weights_made_in_inference_mode_are_packed_afresh_and_updates_seen():
    with torch.inference_mode():  # inference tensors carry no version counter
        model, _ = bf16_pair()
        check_update_is_seen(model, torch.randint(0, model.config.vocab_size, (2, 5)), reused=False)


def check_update_is_seen(model, tokens, *, reused: bool):
    with prepacked(model):
        first = [prepack._ACTIVE[m] for m in linears(model)]
        before, _ = model(tokens)
    with prepacked(model):
        assert all((prepack._ACTIVE[m] is p) == reused for m, p in zip(linears(model), first))  # not repacked
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)  # in place, as an optimiser step or a snapshot refresh writes
    expected, _ = model(tokens)
    with prepacked(model):
        assert prepack._ACTIVE[model.lm_head] is not first[-1]
        after, _ = model(tokens)
    torch.testing.assert_close(after, expected)
    assert (after - before).abs().max() > 0.1  # what the stale packing would have given


@needs_packing
def test_fp32_weights_and_a_disabled_block_are_left_alone():
    model = Transformer(ModelConfig.tiny()).eval()
    with prepacked(model):
        assert all(not is_packed(m) for m in linears(model))
    bf16, _ = bf16_pair()
    with prepacked(bf16, enabled=False):
        assert all(not is_packed(m) for m in linears(bf16))
    with prepacked(None, bf16):
        assert all(is_packed(m) for m in linears(bf16))


def test_the_engine_samples_a_policy_updated_in_place_between_generates(monkeypatch):
    model, head = bf16_pair()
    engine = Engine(model, head)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    config = GenerationConfig(max_new_tokens=12, gamma=2, method="rs", seed=3)
    engine.generate(prompts, config)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    updated = engine.generate(prompts, config)
    fresh = Engine(copy.deepcopy(model), copy.deepcopy(head)).generate(prompts, config)
    assert updated.tokens == fresh.tokens
    monkeypatch.setenv(PACKING_SWITCH, "0")
    assert engine.generate(prompts, config).tokens == updated.tokens  # packed or not: the same samples


def test_with_packing_switched_off_bf16_runs_unpacked_with_the_plain_results(monkeypatch):
    monkeypatch.setenv(PACKING_SWITCH, "0")
    model, head = bf16_pair()
    tokens = torch.randint(0, model.config.vocab_size, (3, 7))
    with torch.inference_mode():
        plain, _ = model(tokens)
        with prepacked(model, head):
            assert not any(is_packed(m) for m in linears(model, head))
            unpacked, _ = model(tokens)
    torch.testing.assert_close(unpacked, plain)


def test_the_switch_forces_the_probe_and_rejects_other_values(monkeypatch):
    monkeypatch.delenv(PACKING_SWITCH, raising=False)
    assert cpu_bf16_packing() == onednn_bf16_works()
    for value, want in (("0", False), ("1", True)):
        monkeypatch.setenv(PACKING_SWITCH, value)
        assert cpu_bf16_packing() is want
    monkeypatch.setenv(PACKING_SWITCH, "yes")
    with pytest.raises(ValueError, match=PACKING_SWITCH):
        cpu_bf16_packing()


AVX2_CHECK = textwrap.dedent("""
    import torch
    from bebop.device import cpu_bf16_packing, cpu_has_fast_bf16, resolve_dtype
    from bebop.engine import Engine
    from bebop.models.config import ModelConfig
    from bebop.models.transformer import Transformer
    from bebop.models.mtp import MTPHead
    from bebop.engine.rollout import GenerationConfig
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.ones(4, 4, dtype=torch.bfloat16))
        refused = False
    except RuntimeError:
        refused = True
    torch.manual_seed(0)
    model = Transformer(ModelConfig.tiny(vocab_size=64, num_hidden_layers=2)).to(torch.bfloat16).eval()
    head = MTPHead(model.config).to(torch.bfloat16).eval()
    out = Engine(model, head).generate([[1, 2, 3], [4, 5]], GenerationConfig(max_new_tokens=8, gamma=2, seed=1))
    print(refused, cpu_bf16_packing(), cpu_has_fast_bf16(), resolve_dtype("auto", "cpu"),
          [len(t) for t in out.tokens])
""")


def test_on_an_avx2_cpu_the_probe_says_no_auto_picks_fp32_and_bf16_generation_runs():
    """oneDNN limited to AVX2 (what a CPU without AVX-512 gives it) refuses to pack bf16: the probe must say so
    on its own (no switch set), `auto` must pick fp32, and a bf16 engine must still generate."""
    env = {k: v for k, v in os.environ.items() if k != PACKING_SWITCH}
    env.update(ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2")
    done = subprocess.run([sys.executable, "-c", AVX2_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False", "False", "torch.float32", "[8,", "8]"], done.stdout


@needs_packing
def test_a_head_over_a_draft_vocabulary_drafts_through_one_packing_of_its_rows():
    """The rows of the LM head a head with a draft vocabulary reads are packed too (once per gathered copy, not on
    every call), with the plain results, and a changed LM head gets a fresh gather and packing."""
    model, head = bf16_pair()
    head.use_draft_vocab(torch.arange(3, 40))
    hidden = torch.randn(2, 1, model.config.hidden_size, dtype=torch.bfloat16)
    with torch.inference_mode():
        plain = head.logits(model, hidden)
        with prepacked(model, head):
            packed = [head.logits(model, hidden) for _ in range(3)]
            rows = head.draft_weight(model)
            assert rows in prepack._ROW_PACKINGS and len(prepack._ROW_PACKINGS) >= 1
            packing = prepack._ROW_PACKINGS[rows]
            head.logits(model, hidden)
            assert prepack._ROW_PACKINGS[rows] is packing  # reused, not packed again
    for logits in packed:
        torch.testing.assert_close(logits, plain)
    with torch.no_grad():
        model.lm_head.weight.mul_(2)  # an RL update in place: the next block must read the new rows
    with torch.inference_mode(), prepacked(model, head):
        assert head.draft_weight(model) is not rows
        torch.testing.assert_close(head.logits(model, hidden), 2 * plain, rtol=2e-2, atol=2e-2)
