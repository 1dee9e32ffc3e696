"""A Qwen3 policy and its MTP head saved so that `transformers` drafts with the head in `generate(use_mtp=True)`.

transformers' generic MTP path (`generation.candidate_generator.MTPCandidateGenerator`, built when
`generate(use_mtp=True)`) needs three things of the loaded model: `config.num_mtp_layers`, MTP checkpoint keys
declared in the model class's `_keys_to_ignore_on_load_unexpected` (`MtpModel.get_mtp_weights_regex` reads the
head's tensors by those patterns), and a decoder layer class to build the MTP block from (`MtpModel` copies the
type of the backbone's last layer). `Qwen3ForCausalLM` declares no MTP keys, so a Qwen3 checkpoint never drafts,
whatever its config says. The class whose math is Qwen3's exactly and which declares `^mtp\\.` is Mellum
(`transformers.models.mellum`), once every layer is full attention with a dense SwiGLU MLP:

    Mellum, configured so                 = Qwen3 + bebop's head
    RMSNorm: weight * x / rms(x)            weight as is (not Qwen3-Next's 1 + weight): no conversion
    q_norm / k_norm per head, full RoPE     layer_types "full_attention", rope_parameters per layer type
    mlp_layer_types "dense"                 SwiGLU with intermediate_size
    hidden_states[-1] after the final norm  h_0 is the backbone's normed output (bebop.models.mtp)
    MtpLayer: post_norm(block(eh_proj([enorm(emb) ; hnorm(h)])))   = norm(layer(fc([norm_e(emb) ; norm_h(h)])))
    mtp.fc / pre_fc_norm_* / layers.0 / norm                       read by transformers' "MtpModel" renames

Tensors keep the names `save_pretrained` writes; only config.json differs (model_type "mellum", so this
directory is for transformers: `load_pretrained` reads Qwen3 configs). One difference that changes only fp32
rounding: transformers places the step-1 entry pairing (h_i, y_{i+1}) at RoPE position i+1, bebop at i; every
query and key moves by the same one, and RoPE attention depends only on their difference.

What transformers does not do: recursion. `num_mtp_layers` is the number of distinct MTP modules, one draft token
each, and Mellum allows one, so `generate(use_mtp=True)` drafts one token per step with bebop's head (its depth-1
draft), where bebop's engine applies the same head `gamma` times. transformers' assisted decoding, this path
included, runs batch 1 only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bebop.files import atomic_open
from bebop.models.checkpoint import CONFIG, save_pretrained
from bebop.models.mtp import MTPHead, check_head_fits
from bebop.models.transformer import Transformer

# Every layer, the MTP one included: attention over the whole prefix (Mellum's MTP default is a sliding window) and
# a SwiGLU MLP (Mellum's default is a mixture of experts).
ATTENTION, MLP = "full_attention", "dense"


def transformers_mtp_config(qwen3: dict[str, Any]) -> dict[str, Any]:
    """The config.json body under which transformers runs a Qwen3 backbone (`qwen3`, the dict that
    `ModelConfig.to_hf_dict` writes, with torch_dtype) and a one-layer `mtp.*` head: a Mellum config."""
    if qwen3.get("model_type") != "qwen3":
        raise ValueError(f"only a Qwen3 policy can be saved for transformers' MTP path, got model_type="
                         f"{qwen3.get('model_type')!r} (Mellum, the class that runs it, has Qwen3's q/k norms)")
    rope = qwen3.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope type {rope['rope_type']!r} cannot be saved for transformers' MTP path "
                         "(default RoPE only)")
    layers = qwen3["num_hidden_layers"]
    shape = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings",
             "hidden_act", "attention_bias", "attention_dropout", "initializer_range", "torch_dtype")
    return {
        **{key: qwen3[key] for key in shape if key in qwen3},
        "architectures": ["MellumForCausalLM"],
        "model_type": "mellum",
        "layer_types": [ATTENTION] * layers,
        "mlp_layer_types": [MLP] * layers,
        "rope_parameters": {ATTENTION: {"rope_type": "default", "rope_theta": qwen3["rope_theta"]}},
        "sliding_window": None,
        "num_nextn_predict_layers": 1,  # Mellum's name for num_mtp_layers
        "mtp_layer_types": [ATTENTION],
        "mtp_mlp_layer_types": [MLP],
        **({"bebop_mtp": qwen3["bebop_mtp"]} if "bebop_mtp" in qwen3 else {}),
    }


def save_for_transformers(model: Transformer, mtp: MTPHead, path: str | os.PathLike) -> None:
    """Write `model` and its head to directory `path` so that `transformers.AutoModelForCausalLM.from_pretrained`
    loads them (a MellumForCausalLM) and `generate(..., use_mtp=True)` drafts with the head; see the module
    docstring for what is equal and what transformers drafts."""
    if not isinstance(mtp, MTPHead):
        raise ValueError(f"mtp must be an MTPHead, got {type(mtp).__name__}")
    if not isinstance(model, Transformer):
        raise ValueError(f"model must be a bebop Transformer, got {type(model).__name__}")
    check_head_fits(mtp.config, model.config)
    if mtp.draft_ids is not None:  # transformers' MTP path drafts through the whole LM head
        raise ValueError(f"the head drafts over a draft vocabulary of {mtp.draft_size} ids, which transformers' "
                         "generate(use_mtp=True) cannot: save a head trained without --draft-vocab")
    if mtp.feature_layers:  # transformers' MtpLayer reads the last hidden state alone
        raise ValueError(f"the head reads fused features of layers {list(mtp.feature_layers)}, which transformers' "
                         "generate(use_mtp=True) cannot: save a head trained without --feature-layers")
    if len(mtp.layers) > 1:  # transformers' MtpLayer is one decoder layer per draft step, not a stack
        raise ValueError(f"the head stacks {len(mtp.layers)} decoder layers, which transformers' generate(use_mtp=True) "
                         "cannot: save a head trained without --head-layers")
    transformers_mtp_config(model.config.to_hf_dict())  # refuse before writing anything
    path = Path(path)
    save_pretrained(model, path, mtp=mtp)
    config = transformers_mtp_config(json.loads((path / CONFIG).read_text()))
    with atomic_open(path / CONFIG, "w") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
