"""`bebop bench engine`'s Hugging Face peer: the same checkpoint through transformers' `generate()`, plain and
assisted (a one-layer draft that computes the self-draft head's distribution)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from bebop.models.checkpoint import save_pretrained


def hf_models(model, dtype, device, workdir: Path):
    """(target, assistant) as transformers models, saved by bebop to `workdir` and loaded back."""
    from transformers import AutoModelForCausalLM

    save_pretrained(model, workdir / "target")
    target = AutoModelForCausalLM.from_pretrained(workdir / "target", dtype=dtype).to(device).eval()
    # The assistant: the target's embedding, final norm and head with one (zeroed-residual) layer, i.e. the same
    # next-token distribution as the self-draft head, at the cost of one decoder layer.
    one_layer = replace(model.config, num_hidden_layers=1)
    from bebop.models.transformer import Transformer

    draft = Transformer(one_layer).to(dtype)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("model.layers.")}
    state.update({k: v for k, v in model.state_dict().items() if k.startswith("model.layers.0.")})
    draft.load_state_dict(state)
    save_pretrained(draft, workdir / "assistant")
    assistant = AutoModelForCausalLM.from_pretrained(workdir / "assistant", dtype=dtype).to(device).eval()
    return target, assistant


def hf_generate(target, prompts: torch.Tensor, mask: torch.Tensor, new_tokens: int, temperature: float,
                assistant=None):
    """Sampled completions of exactly `new_tokens` (no end of sequence), assisted by `assistant` if given."""
    kwargs = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                  min_new_tokens=new_tokens, pad_token_id=0, eos_token_id=None)
    if assistant is not None:
        kwargs.update(assistant_model=assistant, num_assistant_tokens=3, num_assistant_tokens_schedule="constant")
    with torch.inference_mode():
        return target.generate(prompts, attention_mask=mask.to(prompts.device), **kwargs)
