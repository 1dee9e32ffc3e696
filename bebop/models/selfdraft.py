"""A target/draft pair whose draft copies the target exactly: the machinery check for speculative decoding.

The backbone's residual branches end in zeroed output projections (attention's o_proj, the MLP's down_proj),
so every layer runs at full cost but adds nothing: the next-token distribution depends on the current token
only, p(. | y_t) = softmax(lm_head(norm(Emb(y_t)))). The MTP head's fc passes the token embedding through and
its layer is zeroed the same way, so step k computes softmax(lm_head(norm(norm_e(Emb(y_{t+k}))))): the same
distribution, one position ahead (RMSNorm is idempotent up to eps; both final norms share one weight).

Under RS the acceptance is therefore 1 (up to float rounding) at any temperature, and under TO it is
p(argmax q) = max p. Any off-by-one in how an engine aligns drafts, caches and verification shows up at once
as lower RS acceptance, and the step costs are those of a real model of the same shape.
"""

from __future__ import annotations

import torch

from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer


def _zero_residual_outputs(layer: torch.nn.Module) -> None:
    layer.self_attn.o_proj.weight.zero_()
    layer.mlp.down_proj.weight.zero_()


def self_draft_pair(config: ModelConfig, *, seed: int = 0, logit_std: float = 2.0) -> tuple[Transformer, MTPHead]:
    """(target, head) with q == p; `logit_std` sets the spread of the target's logits (its entropy)."""
    if logit_std <= 0:
        raise ValueError(f"logit_std must be > 0, got {logit_std}")
    generator = torch.Generator().manual_seed(seed)
    torch_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # nn.Module init draws from the global generator; restore it afterwards
    try:
        model, head = Transformer(config), MTPHead(config)
    finally:
        torch.random.set_rng_state(torch_state)
    d = config.hidden_size
    with torch.no_grad():
        # The LM head reads a unit-RMS hidden, so each logit has std ≈ logit_std.
        model.model.embed_tokens.weight.normal_(0.0, logit_std / d**0.5, generator=generator)
        if not config.tie_word_embeddings:
            model.lm_head.weight.copy_(model.model.embed_tokens.weight)
        # Random signs on the final norm (the head's too): with a tied LM head the token's own logit would
        # otherwise dominate (e·e/rms = d·rms), making p nearly one-hot on repeating the current token.
        signs = torch.randint(0, 2, (d,), generator=generator).float() * 2 - 1
        model.model.norm.weight.copy_(signs)
        head.norm.weight.copy_(signs)
        for layer in [*model.model.layers, *head.layers]:
            _zero_residual_outputs(layer)
        head.fc.weight.zero_()
        head.fc.weight[:, :d].copy_(torch.eye(d))  # [embedding; hidden] -> embedding
    head.trained_depth = None
    return model.eval(), head.eval()
