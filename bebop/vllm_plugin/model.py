"""`BebopMTPModel`: bebop's MTP head (`bebop.models.mtp`) as a vLLM MTP draft model.

    x = fc([pre_fc_norm_embedding(Emb(y)) ; pre_fc_norm_hidden(h)])      h: the target's last hidden (after its
    h' = norm(layer(x))                                                      final norm) or the head's own h'
    logits = lm_head(h')                                                     Emb, lm_head: the target's, shared

vLLM's proposer calls forward(input_ids, positions, hidden_states) with the next tokens and the target's hidden
states at the same positions (entry (h_i, y_{i+1}) at position i, as bebop places it), then feeds the returned h'
back with the drafted token for steps 2..γ at the following positions: bebop's recursion, in vLLM's paged KV cache.
The decoder layer is the target family's vLLM layer (bebop's head layer is its backbone's), so its names and
shapes are the checkpoint's: mtp.layers.0.self_attn.{q,k,v}_proj load into the fused qkv_proj, gate/up into
gate_up_proj. RMSNorm is weight * x / rms(x) in both (not Qwen3-Next's 1 + weight), so no tensor is converted.
This module imports vLLM; `bebop.vllm_plugin.register` names it to vLLM's registry lazily.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.model_loader.reload.inplace import reload_weights
from vllm.model_executor.models.llama import LlamaDecoderLayer
from vllm.model_executor.models.qwen2 import Qwen2DecoderLayer
from vllm.model_executor.models.qwen3 import Qwen3DecoderLayer
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper, maybe_prefix

from bebop.vllm_plugin.draft import FAMILY_KEY

WEIGHTS = WeightsMapper(
    orig_to_new_stacked={".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"),
                         ".v_proj": (".qkv_proj", "v"), ".gate_proj": (".gate_up_proj", 0),
                         ".up_proj": (".gate_up_proj", 1)},
    orig_to_new_prefix={"mtp.": "model."},
)


def draft_config(vllm_config: VllmConfig):
    """The draft directory's config (`BebopMTPConfig`); the proposer builds drafts under the target's model_config."""
    return vllm_config.speculative_config.draft_model_config.hf_config


def decoder_layer(vllm_config: VllmConfig, prefix: str) -> nn.Module:
    """The target family's vLLM decoder layer, built from the draft config (the target's layer fields)."""
    config = draft_config(vllm_config)
    family = getattr(config, FAMILY_KEY, None)
    if family == "llama":
        return LlamaDecoderLayer(vllm_config=vllm_config, prefix=prefix, config=config)
    layers = {"qwen3": Qwen3DecoderLayer, "qwen2": Qwen2DecoderLayer}
    if family not in layers:
        raise ValueError(f"bebop MTP draft config: {FAMILY_KEY}={family!r}, expected qwen3, qwen2 or llama "
                         "(write the draft directory with bebop.vllm_plugin.write_draft)")
    return layers[family](config=config, cache_config=vllm_config.cache_config,
                          quant_config=vllm_config.quant_config, prefix=prefix)


@support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": -1, "hidden_states": 0, "inputs_embeds": 0})
class BebopMTPPredictor(nn.Module):
    """The head's own modules under the checkpoint's names (mtp.* -> model.*); `embed_tokens` is the target's,
    attached by vLLM's proposer after loading (it does so for every MTP draft)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = draft_config(vllm_config)
        d, eps = config.hidden_size, config.rms_norm_eps
        self.fc = ColumnParallelLinear(2 * d, d, bias=False, gather_output=True, return_bias=False,
                                       quant_config=vllm_config.quant_config, prefix=f"{prefix}.fc")
        self.pre_fc_norm_embedding = RMSNorm(d, eps=eps)
        self.pre_fc_norm_hidden = RMSNorm(d, eps=eps)
        self.layers = nn.ModuleList([decoder_layer(vllm_config, f"{prefix}.layers.0")])
        self.norm = RMSNorm(d, eps=eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # [N, d]
        both = torch.cat([self.pre_fc_norm_embedding(inputs_embeds), self.pre_fc_norm_hidden(hidden_states)], -1)
        out, residual = self.layers[0](positions=positions, hidden_states=self.fc(both), residual=None)
        out, _ = self.norm(out, residual)  # norm(out + residual): the layer's last residual add, then the norm
        return out  # [N, d]


class BebopMTPModel(nn.Module):
    """vLLM's MTP draft interface over `BebopMTPPredictor`; `lm_head` is the target's (attached by the proposer)."""

    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        self.config = draft_config(vllm_config)
        self.model = BebopMTPPredictor(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "mtp"))
        self.logits_processor = LogitsProcessor(self.config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, hidden_states: torch.Tensor,
                intermediate_tensors=None, inputs_embeds: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        return self.model(input_ids, positions, hidden_states, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The head's mtp.* tensors; anything else in the directory is not the head's and is skipped."""
        return AutoWeightsLoader(self).load_weights(((n, w) for n, w in weights if n.startswith("mtp.")),
                                                    mapper=WEIGHTS)


class HeadOnly(nn.Module):
    """The head's own modules of a loaded `BebopMTPModel` under the same names, without the target's shared
    embedding and LM head: vLLM's in-place reload resets every module it is given before loading into it."""

    HEAD_MODULES = ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "layers", "norm")

    def __init__(self, draft: BebopMTPModel):
        super().__init__()
        self.model = nn.Module()
        for name in self.HEAD_MODULES:
            self.model.add_module(name, getattr(draft.model, name))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=WEIGHTS)


def reload_head(drafter, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Load mtp.* `weights` into a running drafter's BebopMTPModel in place (vLLM's reload: weights go through the
    checkpoint loaders and the platform's post-load processing, e.g. the CPU's repacked linear layers)."""
    head = HeadOnly(drafter.model)
    config = SimpleNamespace(model_config=drafter.speculative_config.draft_model_config,
                             load_config=drafter.vllm_config.load_config, lora_config=None)
    reload_weights(config, head, weights_iterator=iter(weights), weights_path=None, is_checkpoint_format=True)
