"""The directory vLLM loads a bebop head from, and the `speculative_config` that points vLLM at it.

    DRAFT/config.json        the policy's config.json with model_type "mtp", architectures ["BebopMTPModel"],
                             bebop_target_model_type (the policy's family) and bebop_mtp (the head's metadata)
    DRAFT/head.safetensors   the head's tensors under their mtp.* names, head.json beside them (`save_head`)

No embedding or LM head is written: vLLM's proposer gives every MTP draft the target's own (shared, so weights
pushed into the policy reach the draft's too). Methods, as bebop names them (`bebop.verify`):
    "rs"  vLLM's draft_sample_method "probabilistic": drafts sampled from the head's q at the request's
          temperature, rejection sampling with q itself (accept min(1, p/q), residual (p - q)+)
    "to"  draft_sample_method "greedy": argmax drafts, q taken as one-hot (accept with p(x), residual p without x)
Both keep rejection_sample_method "standard"; at temperature 0 both are greedy speculative decoding.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bebop.files import atomic_open
from bebop.models.checkpoint import CONFIG, load_head, resolve_checkpoint_dir, save_head
from bebop.models.config import FAMILIES, ModelConfig
from bebop.models.mtp import MTPHead, check_head_fits

MODEL_TYPE = "mtp"  # vLLM's generic MTP model type (config/speculative.py MTPModelTypes)
ARCHITECTURE = "BebopMTPModel"
FAMILY_KEY = "bebop_target_model_type"
DRAFT_SAMPLE = {"rs": "probabilistic", "to": "greedy"}


def policy_config(policy: str | os.PathLike) -> dict[str, Any]:
    """The config.json body of a policy directory (or hub id), checked to be a family bebop reads."""
    hf = json.loads((resolve_checkpoint_dir(policy) / CONFIG).read_text())
    if hf.get("model_type") not in FAMILIES:
        raise ValueError(f"policy {policy}: model_type {hf.get('model_type')!r} is not a family bebop heads draft "
                         f"for in vLLM ({sorted(FAMILIES)})")
    return hf


def write_draft(policy: str | os.PathLike, head: MTPHead | str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write the vLLM draft directory for `head` (an MTPHead, or a directory written by `save_head`) drafting for
    the policy at `policy` into `out` (created; its files replaced); returns `out` as a Path."""
    hf = policy_config(policy)
    model_config = ModelConfig.from_hf_dict(hf)
    if not isinstance(head, MTPHead):
        head = load_head(head, model_config)
    check_head_fits(head.config, model_config)
    if head.draft_ids is not None:  # BebopMTPModel computes logits over the whole LM head
        raise ValueError(f"this head drafts over a draft vocabulary of {head.draft_size} ids, which bebop's vLLM "
                         "draft model does not serve: use bebop's engine (--backend bebop), or a head trained "
                         "without --draft-vocab")
    if head.feature_layers:  # the MTP proposer hands the draft the target's top hidden state alone
        raise ValueError(f"this head reads fused features of layers {list(head.feature_layers)}, which bebop's vLLM "
                         "draft model (an MTP draft, fed the top hidden state) does not serve: use bebop's engine "
                         "(--backend bebop), or a head trained without --feature-layers")
    if len(head.layers) > 1:  # BebopMTPModel runs the block's one decoder layer
        raise ValueError(f"this head stacks {len(head.layers)} decoder layers, which bebop's vLLM draft model (one "
                         "decoder layer per MTP step) does not serve: use bebop's engine (--backend bebop), or a head "
                         "trained without --head-layers")
    out = Path(out)
    save_head(head, out)
    draft = {**hf, "model_type": MODEL_TYPE, "architectures": [ARCHITECTURE], FAMILY_KEY: hf["model_type"],
             "num_nextn_predict_layers": 1,
             "bebop_mtp": {"trained_depth": head.trained_depth, "objective": head.objective}}
    with atomic_open(out / CONFIG, "w") as f:
        f.write(json.dumps(draft, indent=2, sort_keys=True) + "\n")
    return out


def speculative_config(draft: str | os.PathLike, *, gamma: int, method: str) -> dict[str, Any]:
    """vLLM's `speculative_config` for drafting `gamma` tokens per step with the head in directory `draft`
    (`write_draft`), verified by bebop's `method` ("rs" or "to", see the module docstring)."""
    if method not in DRAFT_SAMPLE:
        raise ValueError(f"method must be one of {sorted(DRAFT_SAMPLE)} for a head drafting in vLLM, got {method!r}")
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
        raise ValueError(f"gamma must be a positive int, got {gamma!r}")
    if not (Path(draft) / CONFIG).is_file():
        raise ValueError(f"{draft} is not a draft directory (no {CONFIG}; write one with write_draft)")
    return {"model": str(draft), "method": "mtp", "num_speculative_tokens": gamma,
            "draft_sample_method": DRAFT_SAMPLE[method], "rejection_sample_method": "standard"}
