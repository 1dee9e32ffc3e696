"""Model families: Qwen3 (tied and untied), Qwen2 and Llama-3 checkpoints saved by transformers load into bebop with
transformers' logits and greedy output (plain, TO, RS), bebop's saves load back into transformers, misuse fails in
one line, and loading stays within 1.3x the checkpoint's size in host memory."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from bebop.engine import Engine
from bebop.engine.rollout import GenerationConfig
from bebop.models.checkpoint import load_pretrained, resolve_checkpoint_dir, save_pretrained
from bebop.models.config import Llama3RopeScaling, ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.prepack import prepacked
from bebop.models.selfdraft import self_draft_pair
from bebop.models.transformer import Transformer

transformers = pytest.importorskip("transformers")

VOCAB = 300
ATOL = 1e-4
SHAPE = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
         "rms_norm_eps": 1e-6, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
# Llama 3.1's scaling with a pretraining context of 64: wavelengths above 64 positions (head dims 6..15 at
# theta 10^4, head_dim 16) are stretched 8x and those of 16..64 blended, so logits at positions past a few
# tokens differ from unscaled RoPE by far more than ATOL (checked in `test_logits_match_transformers_fp32`).
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
FAMILIES = {
    "qwen3_tied": lambda: transformers.Qwen3Config(**SHAPE, tie_word_embeddings=True, rope_theta=10_000.0),
    "qwen3_untied": lambda: transformers.Qwen3Config(**SHAPE, tie_word_embeddings=False),
    "qwen2": lambda: transformers.Qwen2Config(**SHAPE, tie_word_embeddings=False, use_sliding_window=False),
    "llama3": lambda: transformers.LlamaConfig(**SHAPE, tie_word_embeddings=True, rope_parameters=dict(LLAMA3)),
}
PROMPTS = [[5, 17, 50, 3], [9], [100, 101, 102, 103, 104, 105, 106, 107, 108], [42, 7]]


def randomize(hf: torch.nn.Module, seed: int) -> None:
    """Weights whose logits spread over a few units, and biases and norm weights away from transformers' zeros
    and ones, so a loader that dropped any of them would show."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=generator) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * (0.3 if name.endswith("bias") else 0.15))


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(name, checkpoint dir, transformers' fp32 model) for one family, saved by transformers."""
    path = tmp_path_factory.mktemp(request.param)
    hf = transformers.AutoModelForCausalLM.from_config(FAMILIES[request.param]())
    randomize(hf, seed=len(request.param))
    hf.save_pretrained(str(path))
    return request.param, path, hf.eval()


def ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_logits_match_transformers_fp32(family):
    name, path, hf = family
    model, mtp = load_pretrained(path, dtype=torch.float32)
    assert mtp is None and model.config.model_type == hf.config.model_type
    assert model.config.tie_word_embeddings == (model.lm_head.weight is model.model.embed_tokens.weight)
    x = ids(2, 96)
    reference = hf(x).logits
    assert reference.std() > 0.5  # logits that spread: the comparison is not between near-constants
    torch.testing.assert_close(model(x)[0], reference, atol=ATOL, rtol=0)
    if name == "llama3":  # the same weights under unscaled RoPE must fail the comparison
        unscaled = Transformer(dataclasses.replace(model.config, rope_scaling=None)).eval()
        unscaled.load_state_dict(model.state_dict())
        assert (unscaled(x)[0] - reference).abs().max() > 100 * ATOL


@torch.no_grad()
def test_bf16_error_within_transformers_own(family):
    """bebop in bf16 is as close to the fp32 reference as transformers in bf16 is (2x + a small eps)."""
    _, path, hf = family
    x = ids(2, 64, seed=1)
    reference = hf(x).logits
    hf_bf16 = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).eval()
    model, _ = load_pretrained(path, dtype=torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16 and model.rope_cos.dtype == torch.bfloat16
    theirs = (hf_bf16(x).logits.float() - reference).abs().max().item()
    ours = (model(x)[0].float() - reference).abs().max().item()
    assert ours <= 2 * theirs + 1e-2, (ours, theirs)


@torch.no_grad()
def test_greedy_output_equals_generate(family):
    """Plain, TO and RS (gamma 3, a random head on this backbone) greedy decoding of a ragged batch equals
    transformers' generate(do_sample=False), run one prompt at a time."""
    _, path, hf = family
    model, _ = load_pretrained(path, dtype=torch.float32)
    torch.manual_seed(0)
    head = MTPHead(model.config).eval()
    steps = 12
    expected = []
    for prompt in PROMPTS:
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=steps, min_new_tokens=steps,
                          eos_token_id=None, pad_token_id=0)
        expected.append(out[0, len(prompt):].tolist())
    engine = Engine(model, head)
    for gamma, method in ((0, "rs"), (3, "to"), (3, "rs")):
        config = GenerationConfig(max_new_tokens=steps, temperature=0, gamma=gamma, method=method)
        assert engine.generate(PROMPTS, config).tokens == expected, (gamma, method)


@torch.no_grad()
def test_transformers_loads_what_bebop_saves(family, tmp_path):
    name, path, _ = family
    model, _ = load_pretrained(path, dtype=torch.float32)
    save_pretrained(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == model.config.model_type
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert type(hf).__name__ == config["architectures"][0]
    x = ids(2, 80, seed=2)
    torch.testing.assert_close(hf(x).logits, model(x)[0], atol=ATOL, rtol=0)
    again, _ = load_pretrained(tmp_path)
    assert again.config == model.config
    if name == "qwen2":  # the q/k/v biases travel under transformers' names
        assert "model.layers.0.self_attn.k_proj.bias" in model.state_dict()


def test_bf16_checkpoint_stays_bf16(tmp_path):
    hf = transformers.AutoModelForCausalLM.from_config(FAMILIES["qwen2"]()).to(torch.bfloat16)
    hf.save_pretrained(str(tmp_path))
    model, _ = load_pretrained(tmp_path)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_config_roundtrip_per_family():
    scaling = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                original_max_position_embeddings=8192)
    for model_type in ("qwen3", "qwen2", "llama"):
        config = ModelConfig.tiny(model_type=model_type, rope_scaling=scaling if model_type == "llama" else None)
        assert ModelConfig.from_hf_dict(config.to_hf_dict()) == config
    assert ModelConfig.tiny(model_type="qwen2").attention_bias and not ModelConfig.tiny(model_type="qwen2").qk_norm
    assert ModelConfig.tiny().qk_norm and not ModelConfig.tiny().attention_bias


@pytest.mark.parametrize("change, match", [
    ({"model_type": "mistral"}, r"model_type='mistral' is not supported: bebop reads \['llama', 'qwen2', 'qwen3'\]"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "rope type 'yarn'"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "missing"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_unsupported_configs_raise_one_line(tmp_path, change, match):
    d = {**ModelConfig.tiny(model_type="llama").to_hf_dict(), **change}
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=match) as error:
        load_pretrained(tmp_path)
    assert "\n" not in str(error.value)


def test_qwen2_sliding_window_raises():
    d = ModelConfig.tiny(model_type="qwen2").to_hf_dict()
    with pytest.raises(ValueError, match="use_sliding_window"):
        ModelConfig.from_hf_dict({**d, "use_sliding_window": True, "sliding_window": 32})


def test_local_paths_never_reach_the_hub(tmp_path):
    assert resolve_checkpoint_dir(tmp_path) == tmp_path
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_checkpoint_dir(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_checkpoint_dir("./runs/nope")


def _python(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter on this checkout; fails the test on a non-zero exit."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), **env}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    return out


def test_hub_ids_resolve_through_the_hub_cache_offline(tmp_path):
    """With HF_HUB_OFFLINE=1 a hub id in the Hugging Face cache loads (huggingface_hub's own resolution), and one
    that is not there fails in one line naming it."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--bebop-tests--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    save_pretrained(Transformer(ModelConfig.tiny(vocab_size=VOCAB, num_hidden_layers=1, model_type="llama")),
                    repo / "snapshots" / commit)
    code = ("import json\nfrom bebop.models import load_pretrained\n"
            "print(load_pretrained('bebop-tests/tiny')[0].config.model_type)\n"
            "try:\n    load_pretrained('bebop-tests/no-such-model')\n"
            "except FileNotFoundError as e:\n    print(json.dumps(str(e)))\n")
    found, missing = _python(code, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path)).stdout.strip().split("\n")
    assert found == "llama"
    message = json.loads(missing)
    assert "'bebop-tests/no-such-model'" in message and "hub" in message and "\n" not in message


# The baseline is taken after one small load: the first meta-device model imports torch's meta kernels (~80 MB,
# once per process, whatever the checkpoint's size), which is an import, not the loader's memory.
PEAK = """
import json, resource, sys
from bebop.default import DEFAULT_DIR
from bebop.models import load_pretrained
load_pretrained(DEFAULT_DIR)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model, _ = load_pretrained(sys.argv[1])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps([(peak - base) * 1024, sorted({str(p.dtype) for p in model.parameters()})]))
"""


def write_random_checkpoint(path: Path, config: ModelConfig, dtype: torch.dtype) -> int:
    """A checkpoint of `config` with random weights written without building the model; returns its bytes."""
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in Transformer(config).state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    save_file({k: torch.randn(s, generator=generator).to(dtype) for k, s in shapes.items()},
              str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({**config.to_hf_dict(), "torch_dtype": str(dtype)[6:]}))
    return (path / "model.safetensors").stat().st_size


@pytest.mark.parametrize("dtype, layers", [(torch.bfloat16, 8), (torch.float32, 4)])
def test_peak_host_memory_of_loading(tmp_path, dtype, layers):
    """~230-270 MB checkpoints, mostly fused q/k/v and gate/up weights: the loader's peak RSS growth (in a fresh
    process, over its baseline after imports) stays within 1.3x the file, and the weights keep its dtype."""
    config = ModelConfig(vocab_size=8192, hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=64)
    size = write_random_checkpoint(tmp_path, config, dtype)
    assert 200e6 < size < 300e6
    grown, dtypes = json.loads(_python(PEAK, str(tmp_path)).stdout)
    assert dtypes == [str(dtype)]
    assert grown < 1.3 * size, f"peak host memory grew {grown / size:.2f}x the checkpoint's {size / 1e6:.0f} MB"


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_self_draft_pair_on_every_family(model_type):
    """The acceptance-ceiling pair (a head that drafts what the policy would) is built the same on every family."""
    scaling = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                original_max_position_embeddings=16) if model_type == "llama" else None
    config = ModelConfig.tiny(vocab_size=64, num_hidden_layers=2, model_type=model_type, rope_scaling=scaling)
    model, head = self_draft_pair(config)
    prompts = [[t % 64 for t in prompt] for prompt in PROMPTS]
    rollout = Engine(model, head).generate(prompts, GenerationConfig(max_new_tokens=24, gamma=3, method="rs", seed=0))
    assert rollout.stats["spec/acceptance_rate"] > 0.99


@torch.no_grad()
def test_packed_bf16_linears_keep_the_bias(family):
    """Inside `prepacked` (the engine's CPU bf16 path, where this CPU packs) a Qwen2 layer's q/k/v bias is added
    exactly as outside it."""
    name, path, _ = family
    if name != "qwen2":
        pytest.skip("only Qwen2 has biased projections")
    model, _ = load_pretrained(path, dtype=torch.bfloat16)
    x = ids(2, 16, seed=3)
    with prepacked(model):
        packed = model(x)[0]
    assert torch.equal(packed, model(x)[0])
