"""Data parallelism through `torch.distributed`, as `torchrun` launches it: one process per device, NCCL between
GPUs, gloo between CPU processes (how CI tests it).

    torchrun --standalone --nproc-per-node 2 -m bebop rl --preset quick --out runs/rl-2

A job calls `init(device)` once (a no-op outside torchrun: one process, world 1) and `finish()` at its end. Every
helper here is the identity in one process, so a job's single-process path is the path it always had.

Models: `shard(model, blocks)` applies FSDP2 (`fully_shard`: each block, then the root); parameters become
DTensors sharded over the ranks. Their full state dicts (checkpoints) are gathered to rank 0's CPU to save, and
every rank loads the same file and keeps its shard. `full_tensor(p)` gathers one parameter (a collective: every rank calls
it, in the same order).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from typing import Any

import torch
import torch.distributed as dist


def launched() -> bool:
    """True when torchrun (or any launcher of its environment) started this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def active() -> bool:
    """True when a process group spans several processes."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """Rank 0: the one process that writes the run directory, checkpoints and samples."""
    return rank() == 0


def local_world() -> int:
    """Processes on this machine (torchrun's LOCAL_WORLD_SIZE; 1 outside torchrun)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if launched() else 1


def init(device: torch.device | str) -> int:
    """Join torchrun's process group (NCCL for a CUDA device, else gloo); returns the world size (1 outside torchrun).

    CUDA: this rank's device becomes the current one, so NCCL and every `.cuda()` use LOCAL_RANK's GPU."""
    if not launched() or int(os.environ["WORLD_SIZE"]) == 1:
        return 1
    if not dist.is_initialized():
        device = torch.device(device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_world_size()


def finish() -> None:
    """Leave the process group. The barrier first: a rank that tears down while another is still in a collective
    makes the other abort (SIGABRT under gloo)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def barrier() -> None:
    if active():
        dist.barrier()


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce(value: torch.Tensor | float, op: str = "sum") -> torch.Tensor:
    """`value` reduced over the ranks ("sum" or "max"), as a new float64/int tensor on the value's device."""
    tensor = torch.as_tensor(value).clone()
    if not active():
        return tensor
    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
    on = tensor.to(_device())
    dist.all_reduce(on, op=reduce_op)
    return on.to(tensor.device)


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank ([obj] in one process)."""
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, *, wait: datetime.timedelta | None = None) -> Any:
    """Rank 0's `obj` on every rank. `wait`: how long the other ranks may wait for rank 0 to send it, when rank 0
    computes it first for longer than the process group's timeout allows a collective (NCCL's: 10 minutes), e.g.
    generates a data set. The wait happens in a gloo group of its own with that timeout, so the default group's
    timeout still catches a hung peer everywhere else."""
    if not active():
        return obj
    group = dist.new_group(backend="gloo", timeout=wait) if wait is not None else None
    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0, group=group)
    if group is not None:
        dist.destroy_process_group(group)
    return box[0]


def all_reduce_grads(parameters) -> None:
    """Sum every parameter's gradient over the ranks (a missing gradient counts as zeros): data parallelism by hand for
    a module whose training entry point is not `forward` (DDP hooks only `forward`)."""
    if not active():
        return
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grad = p.grad.to(_device())
        dist.all_reduce(grad)
        p.grad.copy_(grad)


# --------------------------------------------------------------------------------------------------- FSDP2
@contextlib.contextmanager
def unsharded(model: torch.nn.Module):
    """Within: the root's own parameters (those no block holds: embedding, final norm, LM head) are whole tensors,
    for code that reads them outside `forward` (the MTP head). A no-op for a model that is not sharded."""
    if not hasattr(model, "unshard"):
        yield model
        return
    model.unshard()
    try:
        yield model
    finally:
        model.reshard()


def shard(model: torch.nn.Module, blocks, methods: tuple[str, ...] = (),
          param_dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """FSDP2 over all ranks: each module of `blocks` sharded on its own, then the root; `methods` are root methods
    other than `forward` that run the model (FSDP2 hooks them too). Gradients are summed over the ranks, not
    averaged: a job normalises its loss by the global count itself (the single-process loss).

    `param_dtype` is the dtype the parameters are gathered and computed in: the run's autocast dtype, so a bf16 run
    all-gathers half the bytes (its matmuls cast to bf16 anyway). The float32 shards stay the master weights, and
    gradients are reduced in float32 whatever it is: a sum over ranks in bf16 would round every rank's share."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    mesh = init_device_mesh(_device().type, (dist.get_world_size(),))
    precision = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=precision)
    fully_shard(model, mesh=mesh, mp_policy=precision)
    for name in methods:
        register_fsdp_forward_method(model, name)
    for module in model.modules():
        if hasattr(module, "set_gradient_divide_factor"):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly) sharded DTensor; a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _placed_like(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A whole tensor laid out as `param` is: this rank's shard of it when `param` is a DTensor."""
    if not hasattr(param, "device_mesh"):
        return full
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full.to(param.device, param.dtype), param.device_mesh, param.placements)


# Full state dicts by parameter name, gathered by hand: torch.distributed.checkpoint's get_model_state_dict maps the
# state_dict's keys back to attributes, which fails on a model whose state_dict renames its parameters (bebop's fused
# qkv_proj saves as q_proj/k_proj/v_proj, the Hugging Face names).
def model_state(model: torch.nn.Module) -> dict:
    """The full state dict: a plain model's own `state_dict()`; under FSDP2, {parameter name: whole tensor on the CPU}
    on rank 0 and {} elsewhere (a collective)."""
    if not is_sharded(model):
        return model.state_dict()
    state = {name: full_tensor(p.detach()).cpu() for name, p in model.named_parameters()}
    return state if is_main() else {}


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state dict with whole tensors (rank 0 only under FSDP2, like `model_state`)."""
    saved = optimizer.state_dict()
    if not is_sharded(model):
        return saved
    state = {i: {k: full_tensor(v).cpu() if torch.is_tensor(v) else v for k, v in entry.items()}
             for i, entry in sorted(saved["state"].items())}
    return {"state": state, "param_groups": saved["param_groups"]} if is_main() else {}


def load_model_state(model: torch.nn.Module, state: dict) -> None:
    """Load a `model_state` that every rank read from the same file; each rank keeps its shard."""
    if not is_sharded(model):
        model.load_state_dict(state)
        return
    params = dict(model.named_parameters())
    if set(params) != set(state):
        raise RuntimeError(f"parameter names differ: {sorted(set(params) ^ set(state))[:4]}")
    with torch.no_grad():
        for name, p in params.items():
            if tuple(state[name].shape) != tuple(p.shape):
                raise RuntimeError(f"{name} has shape {tuple(state[name].shape)}, the model {tuple(p.shape)}")
            p.copy_(_placed_like(state[name].to(p.device), p))


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load an `optimizer_state` (every rank the same file): whole moments become this rank's shards."""
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    placed = {i: {k: _placed_like(v, params[int(i)]) if torch.is_tensor(v) and v.dim() else v
                  for k, v in entry.items()} for i, entry in state["state"].items()}
    optimizer.load_state_dict({"state": placed, "param_groups": state["param_groups"]})
