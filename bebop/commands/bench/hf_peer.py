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
                assistant=None, stop_tokens: tuple[int, ...] = ()):
    """Sampled completions [B, P + new] of exactly `new_tokens` (no end of sequence), assisted by `assistant` if
    given; with `stop_tokens`, rows end at the first of them instead (and are padded with it past their end)."""
    kwargs = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=new_tokens)
    if stop_tokens:
        kwargs.update(eos_token_id=list(stop_tokens), pad_token_id=stop_tokens[0])
    else:
        kwargs.update(min_new_tokens=new_tokens, pad_token_id=0, eos_token_id=None)
    if assistant is not None:
        kwargs.update(assistant_model=assistant, num_assistant_tokens=3, num_assistant_tokens_schedule="constant")
    with torch.inference_mode():
        return target.generate(prompts, attention_mask=mask.to(prompts.device), **kwargs)


def generated_tokens(sequences: torch.Tensor, prompt_width: int, stop_tokens: tuple[int, ...] = ()) -> int:
    """The tokens `hf_generate` generated in all rows of `sequences` [B, P + n]: each row's through its first stop
    (the stop counted, as bebop's engine counts it), or all n without one."""
    new = sequences[:, prompt_width:]  # [B, n]
    if not stop_tokens or new.shape[1] == 0:
        return new.numel()
    stopped = torch.isin(new, torch.tensor(stop_tokens, device=new.device))  # [B, n]
    first = torch.where(stopped.any(1), stopped.int().argmax(1) + 1, new.shape[1])  # [B]
    return int(first.sum())


class HFCell:
    """A timed cell of HF `generate()`: every prompt set through it (left-padded prompts and their mask), counting
    the tokens each call generated in `tokens` (the warm-up's, then each round's), as `SetsCell` does for bebop."""

    def __init__(self, target, sets, device, new_tokens: int, temperature: float, assistant=None,
                 stop_tokens: tuple[int, ...] = ()):
        self.target, self.sets, self.device, self.assistant = target, sets, device, assistant
        self.new_tokens, self.temperature, self.stop_tokens = new_tokens, temperature, stop_tokens
        self.tokens: list[int] = []

    def __call__(self) -> list[torch.Tensor]:
        outs = [hf_generate(self.target, prompts.to(self.device), mask, self.new_tokens, self.temperature,
                            self.assistant, self.stop_tokens) for _, prompts, mask in self.sets]
        self.tokens.append(sum(generated_tokens(out, prompts.shape[1], self.stop_tokens)
                               for out, (_, prompts, _) in zip(outs, self.sets)))
        return outs
