"""bf16 linear layers on CPU through oneDNN with their weights packed once, not on every call.

A bf16 `F.linear` on CPU hands oneDNN a row-major weight, which it re-lays-out into its blocked format on every
call; at decoding sizes (1 to a few hundred rows against a few-MB model) that copy is a large share of the
matmul. Inside `prepacked(model, head)` (the engine's `generate()`), every bebop `Linear` of the modules
multiplies by a weight packed ahead of time instead (`torch.ops.mkldnn._reorder_linear_weight`, what inductor's
freezing pass does): the same oneDNN kernel, the same results, without the copy (the tiny policy's linears and
whole decoding steps measured faster: docs/benchmarks.md).

A packing is reused while the weight's version counter and storage say it is unchanged, so a policy updated in
place (an optimiser step, `copy_`, `load_state_dict`) is repacked at the next `prepacked` block, and only then
(weights made under `torch.inference_mode` have no version counter: they are packed afresh every block).
Weights must not change inside a block. Outside one, `Linear` is `nn.Linear`. Anything but a CPU bf16 weight is
left alone, and so is everything on a CPU where oneDNN cannot pack bf16 (AVX2 without AVX-512, or a torch built
without oneDNN: `bebop.device.cpu_bf16_packing`, which `BEBOP_CPU_BF16_PACKING=0` also turns off); there the
block is a no-op and bf16 linears run as plain `F.linear`.

Eager only. Compiled graphs keep `F.linear`: inductor lowers oneDNN's packed matmul only for weights that are
graph constants (frozen, which a policy under RL is not), and routed through a Python custom op instead it
measured no faster (the op's dispatch from the C++ wrapper cost what the packing saved), so `Engine(compile=True)`
does not pack.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from bebop.device import cpu_bf16_packing

# Kept beside the modules, not on them, so deepcopy, pickle and state_dict never meet an opaque oneDNN tensor.
_PACKINGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Linear -> (weight version key, packed)
_ACTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Linear inside a block -> its packed weight
_ROW_PACKINGS = WeakIdKeyDictionary()  # a weight tensor no Linear owns -> its packing (`linear_rows`); by identity


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same checkpoints) that uses its packed weight inside `prepacked`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self)


def linear(x: torch.Tensor, module: nn.Linear, *, detach: bool = False) -> torch.Tensor:
    """module(x), through the packed weight when `prepacked` set one; `detach` keeps the weight out of autograd
    (a frozen weight read by another module, e.g. the MTP head's use of the policy's LM head)."""
    if _ACTIVE and not torch.compiler.is_compiling():  # compiled graphs never pack: see the module docstring
        packed = _ACTIVE.get(module)
        if packed is not None:
            # the bias goes into the kernel, as F.linear's does: added afterwards it rounds differently in bf16
            return torch.ops.mkldnn._linear_pointwise(x, packed, module.bias, "none", [], "")
    weight = module.weight.detach() if detach else module.weight
    return F.linear(x, weight, module.bias)


def linear_rows(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight) for a weight no `Linear` owns (a draft head's rows of the LM head, gathered once per
    version of it): inside a `prepacked` block it too multiplies by a packing, made once per weight tensor. Row-major,
    oneDNN re-lays it out on every call, which cost a draft over 8,192 of SmolLM2's rows more than a draft over all
    49,152 through the packed LM head."""
    if _ACTIVE and not torch.compiler.is_compiling() and _packable(weight) and cpu_bf16_packing():
        packed = _ROW_PACKINGS.get(weight)
        if packed is None:
            packed = _ROW_PACKINGS[weight] = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    return F.linear(x, weight)


def is_packed(module: nn.Linear) -> bool:
    """Whether `module` multiplies by a packed weight now (inside a `prepacked` block)."""
    return module in _ACTIVE


def _packable(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16


def _pack(module: Linear) -> torch.Tensor:
    weight = module.weight.detach()
    if weight.is_inference():  # no version counter to tell an in-place update by: pack afresh every block
        return torch.ops.mkldnn._reorder_linear_weight(weight)
    key = (weight._version, weight.data_ptr(), weight.dtype, tuple(weight.shape))
    cached = _PACKINGS.get(module)
    if cached is None or cached[0] != key:
        cached = _PACKINGS[module] = (key, torch.ops.mkldnn._reorder_linear_weight(weight))
    return cached[1]


@contextmanager
def prepacked(*modules: nn.Module | None, enabled: bool = True) -> Iterator[None]:
    """Within the block, the bebop `Linear`s of `modules` (None entries skipped) with CPU bf16 weights multiply
    by packed copies of their weights, which must not change until the block ends. A no-op with enabled=False
    or where this CPU cannot pack bf16 (`cpu_bf16_packing`)."""
    linears = [m for module in modules if enabled and module is not None for m in module.modules()
               if isinstance(m, Linear) and _packable(m.weight)]
    if linears and not cpu_bf16_packing():
        linears = []
    for m in linears:
        _ACTIVE[m] = _pack(m)
    try:
        yield
    finally:
        for m in linears:
            _ACTIVE.pop(m, None)
