"""The MTP draft head: training chain == cached inference, gradient isolation, target alignment, save/load."""

from __future__ import annotations

import pytest
import torch

from bebop.engine import Engine
from bebop.losses import draft_loss
from bebop.models.checkpoint import load_head, load_pretrained, save_head, save_pretrained
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead, chain_mask, chain_targets, check_head_fits
from bebop.models.transformer import Transformer

VOCAB, DEPTH = 53, 4
ATOL = 1e-4


@pytest.fixture(scope="module", params=[1, 2], ids=["one-layer head", "two-layer head"])
def pair(request) -> tuple[Transformer, MTPHead]:
    """A backbone and a head on it: the block's one decoder layer, or a stack of two (each test holds for both)."""
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=VOCAB, num_hidden_layers=2)
    return Transformer(config).eval(), MTPHead(config, trained_depth=DEPTH, num_layers=request.param).eval()


def tokens(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def test_chain_mask_pattern():
    mask = chain_mask(3, 3).int()
    assert mask.tolist() == [[1, 0, 0, 1, 0, 0, 1, 0, 0],
                             [1, 1, 0, 0, 1, 0, 0, 1, 0],
                             [1, 1, 1, 0, 0, 1, 0, 0, 1]]


@torch.no_grad()
@pytest.mark.parametrize("anchors", [(0, 5), (3, 9), (8, 2)])
def test_chain_equals_cached_inference(pair, anchors):
    """chain()[b, t, k-1] == the head's cached inference path fed the same teacher-forced tokens, for a
    ragged batch whose rows sit at different anchors (prefill 0..t, then steps 2..k one at a time)."""
    model, head = pair
    x = tokens(2, 14, seed=sum(anchors))
    _, hidden = model(x)
    chain = head.chain(model, hidden, x, DEPTH)  # [B, T, γ, V]
    assert chain.shape == (2, 14, DEPTH, VOCAB)
    t = torch.tensor(anchors)
    cache = head.new_cache(2, 16)
    span = max(anchors) + 1
    # Prefill: entry i pairs h_i with token i+1 (rows padded to the longer prefix; stale entries unread).
    logits, out = head.forward_cached(model, hidden[:, :span], x[:, 1:span + 1], cache, kv_len=span)
    rows = torch.arange(2)
    torch.testing.assert_close(logits[rows, t], chain[rows, t, 0], atol=ATOL, rtol=0)
    cache.lengths.copy_(t + 1)
    prev = out[rows, t][:, None]  # [B, 1, d]
    for k in range(2, DEPTH + 1):
        step_tokens = x[rows, t + k][:, None]  # [B, 1]: the data token y_{t+k}
        logits, prev = head.forward_cached(model, prev, step_tokens, cache, kv_len=span + k - 1)
        cache.advance(torch.ones(2, dtype=torch.long))
        torch.testing.assert_close(logits[:, 0], chain[rows, t, k - 1], atol=ATOL, rtol=0)


@torch.no_grad()
def test_write_keys_writes_forward_cached_entries_and_the_last_entry_then_gives_the_same_output(pair):
    """A prefill that writes only keys and values for all entries but the last, then runs the last in full: the
    same cache entries and the same last output as one full forward (what the engine's head prefill relies on)."""
    model, head = pair
    x = tokens(3, 12, seed=7)
    _, hidden = model(x)
    full, split = head.new_cache(3, 16), head.new_cache(3, 16)
    _, out = head.forward_cached(model, hidden[:, :11], x[:, 1:12], full, kv_len=11)
    head.write_keys(model, hidden[:, :10], x[:, 1:11], split, kv_len=11)
    assert split.lengths.tolist() == [0, 0, 0]  # lengths are not moved
    split.lengths += 10
    _, last = head.forward_cached(model, hidden[:, 10:11], x[:, 11:12], split, kv_len=11)
    torch.testing.assert_close(split.k[..., :11, :], full.k[..., :11, :], atol=ATOL, rtol=0)
    torch.testing.assert_close(split.v[..., :11, :], full.v[..., :11, :], atol=ATOL, rtol=0)
    torch.testing.assert_close(last[:, 0], out[:, 10], atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="next_tokens"):
        head.write_keys(model, hidden[:, :10], x[:, 1:10], split)


def test_chain_step1_is_not_trivially_equal_across_steps(pair):
    """Guard against a chain that ignores its step structure: different steps give different logits."""
    model, head = pair
    x = tokens(1, 10, seed=7)
    chain = head.chain(model, model(x)[1], x, DEPTH)
    assert (chain[0, 2, 0] - chain[0, 2, 1]).abs().max() > 1e-3


@pytest.mark.parametrize("frozen", [True, False])
def test_only_the_head_gets_gradient(pair, frozen):
    model, head = pair
    trainable = MTPHead(model.config, num_layers=len(head.layers))
    model.requires_grad_(not frozen)
    try:
        x = tokens(2, 12, seed=3)
        logits, hidden = model(x)
        draft = trainable.chain(model, hidden, x, DEPTH)
        target, labels, mask = chain_targets(logits, x, DEPTH)
        loss = draft_loss(draft, target, objective="e2e_tv", mask=mask)
        loss.backward()
        assert all(p.grad is None for p in model.parameters())
        grads = {n: p.grad for n, p in trainable.named_parameters()}
        assert all(g is not None and g.abs().sum() > 0 for g in grads.values()), [n for n, g in grads.items() if g is None]
        if not frozen:
            assert draft.requires_grad and logits.requires_grad
    finally:
        model.requires_grad_(True)
        model.zero_grad(set_to_none=True)


def test_head_parameters_are_its_own(pair):
    model, head = pair
    names = {n.split(".")[0] for n, _ in head.named_parameters()}
    assert names == {"fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "layers", "norm"}
    assert head.fc.weight.shape == (model.config.hidden_size, 2 * model.config.hidden_size)
    assert not any(p is q for p in head.parameters() for q in model.parameters())


def test_chain_targets_alignment_by_hand():
    B, T, V, depth = 2, 6, 3, 2
    positions = torch.arange(T, dtype=torch.float)[None, :, None]
    logits = (10 * positions + torch.arange(V)).expand(B, T, V).clone()  # logits[b, t, v] = 10 t + v
    x = torch.arange(100, 100 + T)[None].expand(B, T).clone()
    target, labels, mask = chain_targets(logits, x, depth, lengths=torch.tensor([6, 4]))
    assert target.shape == (B, T, depth, V) and labels.shape == (B, T, depth) and mask.shape == (B, T)
    # step k at anchor t: target = backbone logits at t+k, label = token t+k+1
    assert target[0, 1, 0].tolist() == [20.0, 21.0, 22.0]
    assert target[0, 1, 1].tolist() == [30.0, 31.0, 32.0]
    assert target[0, 3, :, 0].tolist() == [40.0, 50.0]
    assert target[0, 4, 1].tolist() == [0.0, 0.0, 0.0]  # past the end: padding
    assert labels[0, 0].tolist() == [102, 103] and labels[0, 3].tolist() == [105, 0]
    # anchor t is valid iff t + depth + 1 < length: t <= 2 for length 6, t <= 0 for length 4
    assert mask.tolist() == [[True, True, True, False, False, False], [True, False, False, False, False, False]]
    assert not target.requires_grad
    with pytest.raises(ValueError, match="depth"):
        chain_targets(logits, x, 0)
    with pytest.raises(ValueError, match="lengths"):
        chain_targets(logits, x, 2, lengths=torch.tensor([6]))


def test_chain_and_ce_loss_agree_on_labels(pair):
    """The CE labels of chain_targets are the tokens the chain is asked to predict (a trained-on-data check:
    a head whose logits put all mass on the labels has zero CE)."""
    model, head = pair
    x = tokens(1, 9, seed=5)
    logits, hidden = model(x)
    _, labels, mask = chain_targets(logits, x, DEPTH)
    oracle = torch.full((1, 9, DEPTH, VOCAB), -30.0).scatter(-1, labels[..., None], 30.0)
    loss = draft_loss(oracle, oracle, objective="ce", labels=labels, mask=mask)
    assert loss.item() < 1e-6
    for k in range(1, DEPTH + 1):
        assert labels[0, 0, k - 1] == x[0, k + 1]


@torch.no_grad()
def test_bf16_and_cache(pair):
    model, head = pair
    low_model = Transformer(model.config).eval()
    low_model.load_state_dict(model.state_dict())
    low_head = MTPHead(model.config, num_layers=len(head.layers))
    low_model, low_head = low_model.to(torch.bfloat16), low_head.to(torch.bfloat16).eval()
    cache = low_head.new_cache(2, 8)
    assert cache.num_layers == len(head.layers) and cache.dtype == torch.bfloat16 and cache.k.shape[2:] == (2, 8, 64)
    x = tokens(2, 5, seed=6)
    _, hidden = low_model(x)
    logits, out = low_head.forward_cached(low_model, hidden[:, :4], x[:, 1:], cache, kv_len=4)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    assert torch.equal(cache.lengths, torch.zeros(2, dtype=torch.long))
    none, _ = low_head.forward_cached(low_model, hidden[:, :1], x[:, 1:2], cache, compute_logits=False)
    assert none is None


def test_bad_inputs(pair):
    model, head = pair
    x = tokens(1, 6)
    hidden = model(x)[1]
    with pytest.raises(ValueError, match="depth"):
        head.chain(model, hidden, x, 0)
    with pytest.raises(ValueError, match="tokens"):
        head.chain(model, hidden, x[:, :5], 2)
    with pytest.raises(ValueError, match="trained_depth"):
        MTPHead(model.config, trained_depth=0)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="num_layers must be a positive int"):
            MTPHead(model.config, num_layers=bad)
    with pytest.raises(ValueError, match=f"cache must have {len(head.layers)} layers"):
        head.forward_cached(model, hidden[:, :2], x[:, 1:3], MTPHead(model.config, num_layers=3).new_cache(1, 8))
    other = Transformer(ModelConfig.tiny(vocab_size=VOCAB + 1, num_hidden_layers=1))
    with pytest.raises(ValueError, match="vocab_size"):
        head.chain(other, hidden, x, 2)


@torch.no_grad()
def test_one_fit_check_names_every_field_that_differs(pair, tmp_path):
    model, head = pair
    check_head_fits(head.config, model.config)  # a head built for this backbone fits
    other = ModelConfig.tiny(vocab_size=VOCAB, num_hidden_layers=2, hidden_size=128, intermediate_size=100)
    with pytest.raises(ValueError) as error:
        check_head_fits(other, model.config)
    assert str(error.value) == (f"MTP head does not match the policy's backbone: hidden_size 128 (head) != "
                                f"{model.config.hidden_size} (policy); intermediate_size 100 (head) != "
                                f"{model.config.intermediate_size} (policy)")
    # Every consumer asks the same question and gets the same answer.
    stranger = MTPHead(other)
    x = tokens(1, 4)
    save_head(stranger, tmp_path / "stranger")
    for consumer in (lambda: Engine(model, stranger), lambda: stranger.chain(model, model(x)[1], x, 2),
                     lambda: load_head(tmp_path / "stranger", model.config)):
        with pytest.raises(ValueError, match=r"does not match the policy's backbone: hidden_size 128 \(head\)"):
            consumer()


def test_save_load_roundtrip(pair, tmp_path):
    model, head = pair
    head.objective = "e2e_tv"
    save_head(head, tmp_path / "head")
    loaded = load_head(tmp_path / "head", model.config)
    assert loaded.trained_depth == DEPTH and loaded.objective == "e2e_tv" and len(loaded.layers) == len(head.layers)
    x = tokens(2, 8, seed=9)
    hidden = model(x)[1]
    torch.testing.assert_close(loaded.chain(model, hidden, x, 2), head.chain(model, hidden, x, 2), atol=0, rtol=0)
    save_pretrained(model, tmp_path / "full", mtp=head)
    _, with_head = load_pretrained(tmp_path / "full")
    assert with_head.trained_depth == DEPTH and with_head.objective == "e2e_tv" and len(with_head.layers) == len(head.layers)
    torch.testing.assert_close(with_head.chain(model, hidden, x, 2), head.chain(model, hidden, x, 2), atol=0, rtol=0)
    wider = ModelConfig.tiny(vocab_size=VOCAB, hidden_size=128)
    with pytest.raises(ValueError, match="hidden_size"):
        load_head(tmp_path / "head", wider)
    with pytest.raises(FileNotFoundError, match="head.json"):
        load_head(tmp_path / "nowhere", model.config)
