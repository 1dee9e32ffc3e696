"""The rollout backend RL generates with: bebop's `Engine` on a snapshot of the policy, or a colocated vLLM
(`bebop.engine.vllm.VLLMEngine`), behind one interface, so the trainer never asks which one it holds.

A backend has
    generate(prompts, config, *, env=None, decode=None)   the `Engine.generate` contract (bebop.play calls it)
    config, full_logprobs                                 the served model's `ModelConfig`; whether rollouts carry
                                                          the policy's entropies
    push_weights(policy, head=None)                       after an update: the policy's weights (and a trained
                                                          head's) into what generates; only while nothing generates
    sleep()                                               before a sync update: vLLM frees its device memory there;
                                                          bebop's engine has nothing to free
`rollout_backend` builds either from the same arguments.
"""

from __future__ import annotations

import copy
from typing import Protocol

import torch

from bebop import distributed
from bebop.engine.generate import Engine
from bebop.engine.rollout import Env, GenerationConfig, Rollout
from bebop.models.config import ModelConfig


class RolloutBackend(Protocol):
    config: ModelConfig
    full_logprobs: bool

    def generate(self, prompts: list[list[int]], config: GenerationConfig, *, env: Env | None = None,
                 decode=None) -> Rollout: ...

    def push_weights(self, policy: torch.nn.Module, head: torch.nn.Module | None = None) -> None: ...

    def sleep(self) -> None: ...


def snapshot(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A frozen copy of `module` in `dtype` (what generates, apart from the float32 master weights)."""
    return copy.deepcopy(module).to(dtype).eval().requires_grad_(False)


@torch.no_grad()
def copy_into(target: torch.nn.Module, source: torch.nn.Module) -> None:
    for dst, src in zip(target.parameters(), source.parameters(), strict=True):
        dst.copy_(distributed.full_tensor(src))  # a sharded policy's whole weights (a collective)


class SnapshotEngine:
    """bebop's engine over a snapshot of the policy (and head) in the rollout dtype, refreshed by `push_weights`.
    Built from the caller's unsharded model: a policy sharded by FSDP2 is not copyable, but its full weights are."""

    def __init__(self, model: torch.nn.Module, head: torch.nn.Module | None, dtype: torch.dtype,
                 device: torch.device):
        self.policy = snapshot(model, dtype).to(device)
        self.head = snapshot(head, dtype) if head is not None else None
        self.engine = Engine(self.policy, self.head)
        self.config, self.full_logprobs = self.engine.config, self.engine.full_logprobs

    def generate(self, prompts: list[list[int]], config: GenerationConfig, **kwargs) -> Rollout:
        return self.engine.generate(prompts, config, **kwargs)

    def push_weights(self, policy: torch.nn.Module, head: torch.nn.Module | None = None) -> None:
        copy_into(self.policy, policy)
        if head is not None and self.head is not None:
            copy_into(self.head, head)

    def sleep(self) -> None:
        pass  # the snapshot is the rollout's own copy: nothing the update could use


def rollout_backend(backend: str, model: torch.nn.Module, head: torch.nn.Module | None, dtype: torch.dtype,
                    device: torch.device, generation: GenerationConfig, *, world: int = 1) -> RolloutBackend:
    """bebop's engine on a snapshot of `model` ("bebop"), or an in-process vLLM colocated with the trainer ("vllm",
    seeded by `generation.seed` and, with `head`, drafting `generation.gamma` tokens a step by `generation.method`
    through bebop's vLLM plugin, fixed at start). `generation` is what every call will ask for (`RLConfig.generation`):
    bebop's engine is asked per call and needs nothing of it here."""
    if backend == "bebop":
        return SnapshotEngine(model, head, dtype, device)
    if backend != "vllm":
        raise ValueError(f"unknown backend {backend!r}; valid names: ['bebop', 'vllm'] (bebop.rl.config.BACKENDS)")
    from bebop.engine.vllm import VLLMEngine

    if world > 1:
        raise ValueError("the vllm backend runs one in-process engine: run it without torchrun")
    return VLLMEngine.colocated(model, dtype, seed=generation.seed or 0, head=head, gamma=generation.gamma,
                                method=generation.method)
