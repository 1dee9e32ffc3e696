"""The policy model and its ragged KV cache: shapes, cached == uncached, ragged rows, keep(), bf16, configs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from bebop.models.config import ModelConfig
from bebop.models.kvcache import KVCache
from bebop.models.transformer import Transformer

VOCAB = 61
ATOL = 2e-5


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig.tiny(vocab_size=VOCAB, num_hidden_layers=2)).eval()


def tokens(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def test_shapes_and_lm_logits(model):
    x = tokens(3, 7)
    logits, hidden = model(x)
    assert logits.shape == (3, 7, VOCAB) and hidden.shape == (3, 7, model.config.hidden_size)
    torch.testing.assert_close(model.lm_logits(hidden[:, 2]), logits[:, 2])
    none, hidden2 = model(x, compute_logits=False)
    assert none is None and torch.equal(hidden2, hidden)


def test_uncached_is_causal(model):
    x = tokens(2, 10)
    y = x.clone()
    y[:, 6:] = (y[:, 6:] + 1) % VOCAB  # change the future only
    with torch.no_grad():
        a, b = model(x)[0], model(y)[0]
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=ATOL, rtol=0)
    assert (a[:, 6:] - b[:, 6:]).abs().max() > 1e-3


def test_tied_head_shares_the_embedding(model):
    assert model.lm_head.weight is model.model.embed_tokens.weight
    untied = Transformer(dataclasses.replace(model.config, tie_word_embeddings=False))
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    assert "lm_head.weight" in untied.state_dict()


def test_fused_projections_keep_qwen3_checkpoint_names(model):
    state = model.state_dict()
    layer = "model.layers.1."
    parts = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"]
    assert all(f"{layer}{p}.weight" in state for p in parts)
    assert not any("qkv_proj" in k or "gate_up_proj" in k for k in state)
    c = model.config
    assert state[f"{layer}self_attn.k_proj.weight"].shape == (c.num_key_value_heads * c.head_dim, c.hidden_size)
    # Loading Qwen3-named tensors fills the fused weights in order: q rows first, then k, then v.
    other = Transformer(model.config)
    other.load_state_dict({k: v + 1 for k, v in state.items()})
    fused = other.model.layers[1].self_attn.qkv_proj.weight
    q_rows = c.num_attention_heads * c.head_dim
    torch.testing.assert_close(fused[:q_rows], state[f"{layer}self_attn.q_proj.weight"] + 1)
    torch.testing.assert_close(fused[-c.num_key_value_heads * c.head_dim:], state[f"{layer}self_attn.v_proj.weight"] + 1)
    # state_dict entries are views: copying into one writes the model (what checkpoint loading relies on).
    with torch.no_grad():
        other.state_dict()[f"{layer}mlp.up_proj.weight"].zero_()
    assert other.model.layers[1].mlp.gate_up_proj.weight[c.intermediate_size:].abs().max() == 0
    assert other.model.layers[1].mlp.gate_up_proj.weight[:c.intermediate_size].abs().max() > 0


def test_qwen2_biases_fuse_and_split_like_weights():
    """Qwen2's q/k/v biases load and save under q_proj.bias / k_proj.bias / v_proj.bias, in the fused rows' order."""
    torch.manual_seed(0)
    qwen2 = Transformer(ModelConfig.tiny(vocab_size=VOCAB, num_hidden_layers=1, model_type="qwen2"))
    state = qwen2.state_dict()
    assert "model.layers.0.self_attn.q_norm.weight" not in state and "qkv_proj" not in " ".join(state)
    c = qwen2.config
    biases = {p: torch.randn(n * c.head_dim) for p, n in (("q_proj", c.num_attention_heads),
                                                         ("k_proj", c.num_key_value_heads),
                                                         ("v_proj", c.num_key_value_heads))}
    qwen2.load_state_dict({**state, **{f"model.layers.0.self_attn.{p}.bias": b for p, b in biases.items()}})
    assert torch.equal(qwen2.model.layers[0].self_attn.qkv_proj.bias, torch.cat(list(biases.values())))
    assert torch.equal(qwen2.state_dict()["model.layers.0.self_attn.k_proj.bias"], biases["k_proj"])


@torch.no_grad()
def test_cached_chunks_equal_uncached(model):
    x = tokens(2, 12, seed=1)
    full, full_hidden = model(x)
    cache = model.new_cache(2, 16)
    pieces, hiddens, start = [], [], 0
    for size in (5, 1, 3, 1, 2):  # a prefill, then decode- and verify-sized chunks
        logits, hidden = model(x[:, start:start + size], cache, kv_len=start + size)
        assert torch.equal(cache.lengths, torch.full((2,), start))  # the forward never moves lengths
        cache.advance(torch.full((2,), size))
        pieces.append(logits)
        hiddens.append(hidden)
        start += size
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.cat(hiddens, 1), full_hidden, atol=ATOL, rtol=0)


@torch.no_grad()
def test_ragged_rows_and_stale_slots(model):
    """Rows at different lengths, padded prompts and rejected drafts leave stale slots; they must never leak."""
    seqs = [tokens(14, seed=10 + i).tolist() for i in range(3)]
    prompt_lens = [3, 7, 5]
    cache = model.new_cache(3, 20)
    padded = torch.stack([torch.tensor(s[:7]) for s in seqs])  # rows 0 and 2 get junk past their prompt
    padded[0, 3:], padded[2, 5:] = 59, 60
    model(padded, cache, kv_len=7)
    cache.lengths.copy_(torch.tensor(prompt_lens))
    lengths = list(prompt_lens)
    for keep in ([1, 3, 2], [2, 1, 3], [3, 2, 1]):  # a verify-like step of 3 tokens, each row keeps its own count
        chunk = torch.stack([torch.tensor(s[n:n + 3]) for s, n in zip(seqs, lengths)])
        logits, _ = model(chunk, cache, kv_len=max(lengths) + 3)
        for b, seq in enumerate(seqs):
            ref = model(torch.tensor([seq[: lengths[b] + 3]]))[0][0, lengths[b]:]
            torch.testing.assert_close(logits[b], ref, atol=ATOL, rtol=0)
        cache.advance(torch.tensor(keep))
        lengths = [n + k for n, k in zip(lengths, keep)]


@torch.no_grad()
def test_keep_drops_rows(model):
    x = tokens(4, 9, seed=2)
    cache = model.new_cache(4, 12)
    model(x[:, :6], cache, kv_len=6)
    cache.lengths.copy_(torch.tensor([6, 4, 5, 6]))
    rows = torch.tensor([3, 1])
    cache.keep(rows)
    assert cache.batch == 2 and cache.k.shape[1] == 2 and torch.equal(cache.lengths, torch.tensor([6, 4]))
    step = torch.stack([x[3, 6:7], x[1, 4:5]])
    logits, _ = model(step, cache, kv_len=7)
    torch.testing.assert_close(logits[0, 0], model(x[3:4, :7])[0][0, -1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1, 0], model(x[1:2, :5])[0][0, -1], atol=ATOL, rtol=0)


@torch.no_grad()
def test_bf16_runs_and_tracks_fp32(model):
    low = Transformer(model.config).eval()
    low.load_state_dict(model.state_dict())
    low = low.to(torch.bfloat16)
    x = tokens(2, 8, seed=3)
    ref = model(x)[0]
    logits, hidden = low(x)
    assert logits.dtype == hidden.dtype == torch.bfloat16
    cache = low.new_cache(2, 10)
    assert cache.dtype == torch.bfloat16
    first, _ = low(x[:, :5], cache, kv_len=5)
    cache.advance(torch.tensor([5, 5]))
    rest, _ = low(x[:, 5:], cache, kv_len=8)
    cached = torch.cat([first, rest], 1).float()
    scale = ref.abs().max()
    assert (logits.float() - ref).abs().max() < 0.05 * scale
    assert (cached - ref).abs().max() < 0.05 * scale


def test_training_path_has_gradients(model):
    trainable = Transformer(model.config)
    logits, _ = trainable(tokens(2, 6, seed=4))
    logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable.parameters())


def test_shared_prefix_rows_equal_the_concatenated_rows_with_their_gradients(model):
    """forward_shared_prefix (the GRPO update's layout) gives each row's logits and hidden states as forward()
    does on prompt + suffix, for prompts and suffixes of different lengths, and the same gradient."""
    trainable = Transformer(model.config)
    trainable.load_state_dict(model.state_dict())
    prompts = [tokens(5, seed=1).tolist(), tokens(2, seed=2).tolist(), tokens(3, seed=3).tolist()]
    suffixes = [tokens(n, seed=10 + n).tolist() for n in (3, 1, 5, 2, 4)]
    group = torch.tensor([0, 0, 1, 2, 2])
    prefix = torch.zeros(3, 5, dtype=torch.long)
    suffix = torch.full((5, 5), VOCAB - 1)  # padding past each suffix: must not leak into real positions
    for i, p in enumerate(prompts):
        prefix[i, : len(p)] = torch.tensor(p)
    for i, t in enumerate(suffixes):
        suffix[i, : len(t)] = torch.tensor(t)
    lengths = torch.tensor([len(p) for p in prompts])
    prefix_logits, prefix_hidden, suffix_logits, suffix_hidden = trainable.forward_shared_prefix(
        prefix, lengths, suffix, group)
    assert prefix_logits.shape == (3, 5, VOCAB) and suffix_hidden.shape == (5, 5, model.config.hidden_size)
    shared_loss, plain_loss = 0.0, 0.0
    plain = Transformer(model.config)
    plain.load_state_dict(model.state_dict())
    for n, g in enumerate(group.tolist()):
        P, S = len(prompts[g]), len(suffixes[n])
        logits, hidden = plain(torch.tensor([prompts[g] + suffixes[n]]))
        torch.testing.assert_close(suffix_logits[n, :S], logits[0, P:], atol=ATOL, rtol=0)
        torch.testing.assert_close(suffix_hidden[n, :S], hidden[0, P:], atol=ATOL, rtol=0)
        torch.testing.assert_close(prefix_logits[g, :P], logits[0, :P], atol=ATOL, rtol=0)
        plain_loss = plain_loss + logits[0].logsumexp(-1).sum()  # every position of the row, prompt included
        shared_loss = shared_loss + prefix_logits[g, :P].logsumexp(-1).sum() + suffix_logits[n, :S].logsumexp(-1).sum()
    plain_loss.backward()
    shared_loss.backward()
    for (name, a), b in zip(trainable.named_parameters(), plain.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=name)
    with pytest.raises(ValueError, match="group"):
        trainable.forward_shared_prefix(prefix, lengths, suffix, group[:3])
    with pytest.raises(ValueError, match="max_position_embeddings"):
        long = torch.zeros(1, model.config.max_position_embeddings, dtype=torch.long)
        trainable.forward_shared_prefix(long, torch.tensor([3]), tokens(1, 2), torch.tensor([0]))


def test_cache_errors_and_bounds(model):
    cache = model.new_cache(2, 6)
    with pytest.raises(ValueError, match="kv_len"):
        model(tokens(2, 3), cache, kv_len=7)
    with pytest.raises(ValueError, match="kv_len"):
        model(tokens(2, 3), cache, kv_len=2)
    with pytest.raises(ValueError, match="batch"):
        model(tokens(3, 1), cache)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.new_cache(1, model.config.max_position_embeddings + 1)
    with pytest.raises(ValueError, match="tokens"):
        model(tokens(6))
    cache.lengths.fill_(5)  # the engine must not let this happen; when it does, the write is not silent
    with pytest.raises((IndexError, RuntimeError)):
        model(tokens(2, 2), cache)


def test_kvcache_api():
    cache = KVCache(3, 4, 2, 10, 8, torch.float32, "cpu")
    assert cache.k.shape == (3, 4, 2, 10, 8)
    cache.advance(torch.tensor([1, 2, 3, 4]))
    assert cache.positions(2).tolist() == [[1, 2], [2, 3], [3, 4], [4, 5]]
    cache.keep(torch.tensor([2, 0]))
    assert cache.lengths.tolist() == [3, 1] and cache.batch == 2
    with pytest.raises(ValueError, match="advance"):
        cache.advance(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="max_len"):
        KVCache(1, 1, 1, 0, 8)


def test_keep_moves_only_the_rows_that_move_through_the_slots_they_wrote_in_place():
    """A retirement compacts in place: row i of the kept cache is row rows[i] through slot `through` - 1, and no new
    buffer is made (a new cache per retirement copied every row's every slot). Without `through` (the compiled
    engine's graphs guard on strides) the buffers are new and contiguous."""
    cache = KVCache(2, 5, 2, 10, 4)
    cache.k.normal_(), cache.v.normal_()
    cache.lengths.copy_(torch.tensor([3, 4, 5, 6, 7]))
    k, v, storage = cache.k.clone(), cache.v.clone(), cache.k.untyped_storage().data_ptr()
    cache.keep([0, 2, 4], through=8)
    assert cache.batch == 3 and cache.lengths.tolist() == [3, 5, 7]
    assert cache.k.untyped_storage().data_ptr() == storage
    for new, old in enumerate([0, 2, 4]):
        assert torch.equal(cache.k[:, new, :, :8], k[:, old, :, :8]) and torch.equal(cache.v[:, new, :, :8], v[:, old, :, :8])
    assert torch.equal(cache.k[:, 1, :, 8:], k[:, 1, :, 8:])  # past `through`: left as it was (stale, never read)
    moved = cache.k[:, 2].clone()
    cache.keep(torch.tensor([2, 0]))  # without `through`: new contiguous buffers, as compiled steps need; any order
    assert cache.k.is_contiguous() and cache.v.is_contiguous() and cache.k.untyped_storage().data_ptr() != storage
    assert torch.equal(cache.k[:, 0], moved) and torch.equal(cache.k[:, 1], k[:, 0]) and cache.lengths.tolist() == [7, 3]
    for rows, match in (([0, 0], "distinct"), ([0, 1, 2], "at most 2")):
        with pytest.raises(ValueError, match=match):
            cache.keep(rows)


@pytest.mark.parametrize("change, match", [
    (dict(hidden_size=0), "hidden_size"),
    (dict(num_attention_heads=3), "multiple"),
    (dict(head_dim=63), "even"),
    (dict(vocab_size=True), "vocab_size"),
    (dict(num_hidden_layers=2.0), "num_hidden_layers"),
    (dict(rms_norm_eps=0.0), "rms_norm_eps"),
    (dict(rope_theta=-1.0), "rope_theta"),
    (dict(tie_word_embeddings=1), "tie_word_embeddings"),
])
def test_bad_config_values_raise(change, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.tiny(**change)


def test_presets_and_hf_dict():
    tiny = ModelConfig.tiny(vocab_size=100)
    assert 2e6 < Transformer(tiny).num_parameters() < 5e6
    with torch.device("meta"):
        assert 1e8 < Transformer(ModelConfig.small()).num_parameters() < 2.5e8
    d = tiny.to_hf_dict()
    assert d["model_type"] == "qwen3" and d["architectures"] == ["Qwen3ForCausalLM"]
    assert ModelConfig.from_hf_dict({**d, "something_new": 1}) == tiny
    legacy = {k: v for k, v in d.items() if k not in ("rope_parameters", "head_dim", "num_key_value_heads")}
    legacy["rope_theta"] = 5000.0
    back = ModelConfig.from_hf_dict(legacy)  # older Qwen3 configs: top-level rope_theta, derived head_dim
    assert back.rope_theta == 5000.0 and back.head_dim == 64 and back.num_key_value_heads == 4
    with pytest.raises(ValueError, match="intermediate_size"):
        ModelConfig.from_hf_dict({k: v for k, v in d.items() if k != "intermediate_size"})
    for bad, match in (({"hidden_act": "gelu"}, "hidden_act"), ({"model_type": "mistral"}, "model_type"),
                       ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope")):
        with pytest.raises(ValueError, match=match):
            ModelConfig.from_hf_dict({**d, **bad})
