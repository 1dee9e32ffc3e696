"""Hugging Face interop: transformers loads bebop's checkpoints (and vice versa) with the same logits."""

from __future__ import annotations

import inspect
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from bebop.models.checkpoint import load_pretrained, save_pretrained
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer

transformers = pytest.importorskip("transformers")

VOCAB = 97
ATOL = 1e-4


def tokens(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def make(tied: bool = True) -> Transformer:
    torch.manual_seed(1 if tied else 2)
    return Transformer(ModelConfig.tiny(vocab_size=VOCAB, num_hidden_layers=2, tie_word_embeddings=tied)).eval()


def hf_load(path) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tied bebop model with an MTP head, saved once, and transformers' view of it."""
    path = tmp_path_factory.mktemp("ckpt")
    model = make()
    head = MTPHead(model.config, trained_depth=3, objective="e2e_tv")
    save_pretrained(model, path, mtp=head)
    return path, model, head, hf_load(path)


def test_layout_and_config(saved):
    path, model, head, _ = saved
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]  # no temp files left
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["torch_dtype"] == "float32"
    assert config["bebop_mtp"]["trained_depth"] == 3 and config["bebop_mtp"]["objective"] == "e2e_tv"
    names = set(load_file(str(path / "model.safetensors")))
    assert "lm_head.weight" not in names  # tied: stored once, as HF does
    assert {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
            "mtp.layers.0.self_attn.q_proj.weight", "mtp.norm.weight"} <= names
    assert "model.layers.1.self_attn.k_norm.weight" in names


@torch.no_grad()
def test_transformers_loads_same_logits(saved):
    _, model, _, hf = saved
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    x = tokens(3, 11)
    torch.testing.assert_close(hf(x).logits, model(x)[0], atol=ATOL, rtol=0)


@torch.no_grad()
def test_untied_model_roundtrips_through_transformers(tmp_path):
    model = make(tied=False)
    save_pretrained(model, tmp_path)
    assert "lm_head.weight" in load_file(str(tmp_path / "model.safetensors"))
    x = tokens(2, 9, seed=1)
    torch.testing.assert_close(hf_load(tmp_path)(x).logits, model(x)[0], atol=ATOL, rtol=0)
    again, mtp = load_pretrained(tmp_path)
    assert mtp is None  # no mtp.* tensors -> no head
    torch.testing.assert_close(again(x)[0], model(x)[0], atol=0, rtol=0)


def _hf_step(hf, ids, cache):
    name = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    out = hf(ids, use_cache=True, **{name: cache})
    return out.logits, getattr(out, "cache", None) or out.past_key_values


@torch.no_grad()
def test_ragged_kv_cache_matches_transformers_per_row(saved):
    """bebop decodes three rows of different prompt lengths in one ragged batch; each row must match
    transformers run on that row alone with its own KV cache."""
    _, model, _, hf = saved
    prompt_lens, steps = [2, 7, 4], 5
    seqs = [tokens(max(prompt_lens) + steps, seed=20 + i) for i in range(3)]
    cache = model.new_cache(3, 16)
    batch = torch.stack([s[: max(prompt_lens)] for s in seqs])
    ours = [[] for _ in seqs]
    logits, _ = model(batch, cache, kv_len=max(prompt_lens))
    for b, n in enumerate(prompt_lens):
        ours[b].append(logits[b, n - 1])
    cache.lengths.copy_(torch.tensor(prompt_lens))
    for s in range(steps):
        step = torch.stack([seq[n + s: n + s + 1] for seq, n in zip(seqs, prompt_lens)])
        logits, _ = model(step, cache, kv_len=max(prompt_lens) + s + 1)
        cache.advance(torch.ones(3, dtype=torch.long))
        for b in range(3):
            ours[b].append(logits[b, 0])
    for b, (seq, n) in enumerate(zip(seqs, prompt_lens)):
        hf_logits, hf_cache = _hf_step(hf, seq[None, :n], None)
        theirs = [hf_logits[0, -1]]
        for s in range(steps):
            hf_logits, hf_cache = _hf_step(hf, seq[None, n + s: n + s + 1], hf_cache)
            theirs.append(hf_logits[0, -1])
        torch.testing.assert_close(torch.stack(ours[b]), torch.stack(theirs), atol=ATOL, rtol=0)


@torch.no_grad()
def test_reads_a_transformers_checkpoint_sharded(tmp_path):
    """A directory written by transformers itself (sharded, with an index) loads into bebop unchanged."""
    model = make(tied=False)
    hf_config = transformers.Qwen3Config(**{k: v for k, v in model.config.to_hf_dict().items()
                                            if k not in ("architectures", "model_type")})
    hf = transformers.Qwen3ForCausalLM(hf_config).eval()
    hf.save_pretrained(str(tmp_path), max_shard_size="1MB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ours, mtp = load_pretrained(tmp_path)
    assert mtp is None and ours.config == model.config
    x = tokens(2, 8, seed=3)
    torch.testing.assert_close(ours(x)[0], hf(x).logits, atol=ATOL, rtol=0)


def test_head_roundtrip_and_dtype(saved, tmp_path):
    path, model, head, _ = saved
    loaded, mtp = load_pretrained(path)
    assert mtp is not None and mtp.trained_depth == 3 and mtp.objective == "e2e_tv"
    for (name, a), b in zip(head.state_dict().items(), mtp.state_dict().values()):
        assert torch.equal(a, b), name
    low, low_head = load_pretrained(path, dtype=torch.bfloat16)
    assert low.lm_head.weight.dtype == low_head.fc.weight.dtype == torch.bfloat16
    assert low.lm_head.weight is low.model.embed_tokens.weight
    save_pretrained(low, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert load_pretrained(tmp_path)[0].lm_head.weight.dtype == torch.bfloat16  # default: the stored dtype


def test_missing_files_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pretrained(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(make().config.to_hf_dict()))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_pretrained(tmp_path)


def test_missing_or_misshaped_tensors_raise(saved, tmp_path):
    path, model, _, _ = saved
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    tensors = load_file(str(path / "model.safetensors"))
    broken = dict(tensors)
    del broken["model.layers.1.mlp.up_proj.weight"]
    save_file(broken, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight"):
        load_pretrained(tmp_path)
    broken = dict(tensors)
    broken["model.norm.weight"] = torch.ones(3)
    save_file(broken, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="model.norm.weight"):
        load_pretrained(tmp_path)
    broken = dict(tensors)
    del broken["mtp.fc.weight"]
    save_file(broken, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="mtp.*fc.weight"):
        load_pretrained(tmp_path)
