"""`distributed.shard(param_dtype=...)`: FSDP2 gathers the parameters in the run's dtype (bf16 halves the all-gathers)
and keeps float32 master shards and float32 gradients. One gloo rank in this process: the policy is FSDP2's own, so
one rank shows it as two would (tests/test_distributed.py runs two)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from bebop import distributed
from bebop.models.config import ModelConfig
from bebop.models.transformer import Transformer


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float32])
def test_shard_computes_in_the_run_dtype_over_float32_masters(one_rank, param_dtype):
    model = Transformer(ModelConfig.tiny(vocab_size=32, num_hidden_layers=1))
    distributed.shard(model, model.model.layers, param_dtype=param_dtype)
    seen = []  # registered after FSDP's own hook, so it sees the gathered parameters
    model.model.layers[0].register_forward_pre_hook(lambda module, args: seen.append(next(module.parameters()).dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = model(torch.randint(0, 32, (2, 5)))
    logits.float().sum().backward()
    assert seen == [param_dtype]
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
               for p in model.parameters())
