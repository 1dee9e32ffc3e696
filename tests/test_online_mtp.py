"""Online MTP in RL: the head's step from hidden states, micro-batched over rows, equals one step on all rows."""

from __future__ import annotations

import copy

import pytest
import torch

from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer
from bebop.rl.online_mtp import OnlineMTP


@pytest.mark.parametrize("strategy", ["online-tv", "online-ce"])
@pytest.mark.parametrize("draft_vocab", [None, 50])
def test_micro_batched_rows_give_the_whole_batch_step(strategy, draft_vocab):
    """Also for a head over a draft vocabulary (its targets' log-normalisers from the whole LM head; 50 of 53 ids: a
    near-uniform q over a small S would lie above p on all of S, where TV has nothing left to gain)."""
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=53, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    ids = None if draft_vocab is None else torch.randperm(53)[:draft_vocab].sort().values
    policy, head = Transformer(config).eval(), MTPHead(config, draft_ids=ids)
    tokens = torch.randint(0, 53, (5, 14))  # [B, L]
    lengths, prompt_lengths = torch.tensor([14, 11, 9, 14, 6]), torch.tensor([3, 4, 3, 5, 4])
    _, hidden = policy(tokens)  # [B, L, d]
    results = []
    for rows in (8, 2):  # all rows at once; then uneven micro-batches of 2, 2, 1 rows (the last one has no anchor)
        online = OnlineMTP(copy.deepcopy(head), strategy, lr=1e-3, grad_clip=1e9, depth=2, micro_batch_rows=rows)
        stats = online.update(policy, hidden, tokens, lengths, prompt_lengths)
        results.append((stats, {n: p.grad for n, p in online.head.named_parameters()}))
    (whole, whole_grads), (micro, micro_grads) = results
    assert whole["mtp/online_update"] == micro["mtp/online_update"] == 1
    for name in (f"mtp/loss/{online.objective}", "mtp/d_tv_mean", "mtp/grad_norm"):
        assert micro[name] == pytest.approx(whole[name], rel=1e-5), name
    assert any(g.abs().max() > 0 for g in whole_grads.values())
    for name, grad in whole_grads.items():
        torch.testing.assert_close(micro_grads[name], grad, rtol=1e-4, atol=1e-7, msg=name)


def test_micro_batch_rows_must_be_positive():
    head = MTPHead(ModelConfig.tiny(vocab_size=11, hidden_size=16, intermediate_size=32, num_hidden_layers=1))
    with pytest.raises(ValueError, match="micro_batch_rows"):
        OnlineMTP(head, "online-tv", lr=1e-3, grad_clip=1.0, depth=2, micro_batch_rows=0)
