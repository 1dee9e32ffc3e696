"""Push a head's weights into a running vLLM engine that drafts with a bebop head (online MTP: the head changes
between rollouts). The draft shares the target's embedding and LM head, so pushing the policy's weights already
moves those; this pushes the head's own tensors, under the draft directory's names (mtp.*).

    push_head(llm, head)      # llm: vllm.LLM started with speculative_config(...) of a bebop draft
"""

from __future__ import annotations

from typing import Any

import torch

from bebop.models.checkpoint import MTP_PREFIX
from bebop.models.mtp import MTPHead


def head_weights(head: MTPHead) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of the head under the draft directory's names, on the CPU, detached."""
    if not isinstance(head, MTPHead):
        raise ValueError(f"head must be an MTPHead, got {type(head).__name__}")
    return [(MTP_PREFIX + name, t.detach().cpu()) for name, t in head.state_dict().items()]


def _load_into_drafter(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs in each vLLM worker (collective_rpc passes the worker first): the drafter's model loads the pairs."""
    drafter = getattr(worker.model_runner, "drafter", None)
    model = getattr(drafter, "model", None)
    if model is None or type(model).__name__ != "BebopMTPModel":
        raise ValueError(f"this vLLM engine does not draft with a bebop head (drafter {type(drafter).__name__})")
    from bebop.vllm_plugin.model import reload_head

    reload_head(drafter, weights)


def push_head(llm: Any, head: MTPHead) -> None:
    """Load `head`'s weights into every worker's draft model of `llm` (a vllm.LLM)."""
    llm.collective_rpc(_load_into_drafter, args=(head_weights(head),))
