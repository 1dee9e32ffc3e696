"""Checkpoints in the Hugging Face layout, so bebop and `transformers` (and vLLM) read each other's models.

A directory holds
    config.json          the family's transformers config (Qwen3Config, Qwen2Config or LlamaConfig fields, with
                         model_type, architectures and torch_dtype), plus "bebop_mtp" {trained_depth, objective}
                         when an MTP head is stored
    model.safetensors    model.* / lm_head.weight (omitted when tied, as HF does) and, optionally, the head
                         under the `mtp.*` names Qwen3-Next / Qwen3.5 checkpoints use (mtp.fc.weight,
                         mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight, mtp.layers.0.*,
                         mtp.norm.weight). `transformers` ignores the mtp.* tensors when it loads the backbone.
`load_pretrained` also reads a sharded `model.safetensors.index.json` directory (a real checkpoint), and a hub id
(`resolve_checkpoint_dir`: huggingface_hub's cache and download, the ones transformers uses, so it works online
and fails clearly offline).
A head alone saves as `head.safetensors` (mtp.* names) + `head.json` with `save_head` / `load_head`. A head with fused
features (bebop.models.mtp) also stores mtp.fuse.weight and mtp.fuse_norms.* and records its `feature_layers`; a deeper
head stores mtp.layers.1.* on and records its `num_hidden_layers` (1 otherwise). A head with a
draft vocabulary (bebop.draft_vocab) also stores it as EAGLE-3 heads do: `mtp.d2t` (int64 [K], target id = draft
index + d2t[index]) and `mtp.t2d` (bool [V]), and records `draft_vocab_size` beside its other metadata.

Loading builds the modules on the meta device, gives them uninitialised memory in the asked dtype and copies the
checkpoint's tensors in, one at a time straight from the file: the host never holds a random-init or fp32 copy
besides the weights, and its peak memory stays about the checkpoint's size at that dtype (tests/test_families.py
measures it).

Every file is written to a temporary name and moved into place with os.replace, so a crash mid-save never
leaves a truncated file under the real name.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save

from bebop.draft_vocab import from_d2t, to_d2t, to_t2d
from bebop.files import atomic_open
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead, check_head_fits
from bebop.models.transformer import Transformer

WEIGHTS, INDEX, CONFIG = "model.safetensors", "model.safetensors.index.json", "config.json"
HEAD_WEIGHTS, HEAD_CONFIG = "head.safetensors", "head.json"
MTP_PREFIX = "mtp."
# The layer fields a head's weights depend on, recorded in head.json; a head loads onto any backbone that agrees
# on them (`check_head_fits`).
HEAD_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
# What a hub download fetches: configs, weights, tokenizer files and chat templates (heads beside the policy too).
HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.jinja", "merges.txt", "*.model"]
# Largest piece of a checkpoint read at once (see `_copy_tensor`).
BLOCK_BYTES = 16 * 2**20


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _parse_dtype(name: str, where: Path) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{where}: unknown torch_dtype {name!r}")
    return dtype


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with atomic_open(path, "w") as f:
        f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    with atomic_open(path) as f:
        # clone: fused projections' state_dict entries are views of one weight, and safetensors refuses
        # tensors that share memory
        f.write(save({k: v.detach().to("cpu").clone() for k, v in tensors.items()}, metadata={"format": "pt"}))


def _head_meta(mtp: MTPHead) -> dict[str, Any]:
    meta = {"trained_depth": mtp.trained_depth, "objective": mtp.objective, "num_hidden_layers": len(mtp.layers)}
    if mtp.feature_layers:  # fused features: the backbone layers it reads beside the top hidden (bebop.models.mtp)
        meta["feature_layers"] = list(mtp.feature_layers)
    return meta if mtp.draft_ids is None else {**meta, "draft_vocab_size": mtp.draft_size}


def _head_from_meta(config: ModelConfig, meta: dict[str, Any]) -> MTPHead:
    """The head `_head_meta` describes, for a backbone of `config`, built where the caller builds (the loaders: meta)."""
    return MTPHead(config, trained_depth=meta.get("trained_depth"), objective=meta.get("objective"),
                   feature_layers=tuple(meta.get("feature_layers", ())), num_layers=meta.get("num_hidden_layers", 1))


def _head_tensors(mtp: MTPHead) -> dict[str, torch.Tensor]:
    """The head's tensors under their mtp.* names, its draft vocabulary as d2t / t2d."""
    tensors = dict(mtp.state_dict())
    if mtp.draft_ids is not None:
        tensors.update(d2t=to_d2t(mtp.draft_ids), t2d=to_t2d(mtp.draft_ids, mtp.config.vocab_size))
    return {MTP_PREFIX + k: v for k, v in tensors.items()}


def _read_draft_ids(index: dict[str, TensorRef], where: Path) -> torch.Tensor | None:
    """The draft vocabulary a head's tensors `index` (mtp. prefix removed) store, taking d2t / t2d out of it."""
    d2t, t2d = index.pop("d2t", None), index.pop("t2d", None)
    if d2t is None and t2d is None:
        return None
    if d2t is None or t2d is None:
        raise ValueError(f"{where}: a draft vocabulary needs both mtp.d2t and mtp.t2d")
    with safe_open(str(d2t[0]), framework="pt", device="cpu") as f:
        ids = from_d2t(f.get_tensor(d2t[1]))
    with safe_open(str(t2d[0]), framework="pt", device="cpu") as f:
        mask = f.get_tensor(t2d[1])
    if mask.dtype != torch.bool or mask.dim() != 1 or not torch.equal(mask.nonzero()[:, 0], ids):
        raise ValueError(f"{where}: mtp.t2d does not mark exactly the ids mtp.d2t encodes")
    return ids


def save_pretrained(model: Transformer, path: str | os.PathLike, mtp: MTPHead | None = None) -> None:
    """Write `model` (and the MTP head, if given) to directory `path` in the Hugging Face layout."""
    if not isinstance(model, Transformer):
        raise ValueError(f"model must be a bebop Transformer, got {type(model).__name__}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        del tensors["lm_head.weight"]  # HF stores the tied matrix once, under model.embed_tokens
    if mtp is not None:
        tensors.update(_head_tensors(mtp))
    config = model.config.to_hf_dict()
    config["torch_dtype"] = _dtype_name(model.model.embed_tokens.weight.dtype)
    if mtp is not None:
        config["bebop_mtp"] = _head_meta(mtp)
    _write_tensors(path / WEIGHTS, tensors)
    _write_json(path / CONFIG, config)  # last: a directory with a config has its weights


def _weight_files(path: Path) -> list[Path]:
    if (path / WEIGHTS).is_file():
        return [path / WEIGHTS]
    if (path / INDEX).is_file():
        shards = sorted(set(json.loads((path / INDEX).read_text())["weight_map"].values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{path / INDEX} names shard files that do not exist: {missing}")
        return [path / s for s in shards]
    raise FileNotFoundError(f"no weights in {path}: expected {WEIGHTS} or {INDEX}")


def weights_hash(path_or_hub_id: str | os.PathLike) -> str:
    """The sha256 of a checkpoint's policy weights: each tensor's name, dtype, shape and bytes, in name order, read
    from its safetensors files (a head stored beside them under mtp.* left out). It names the weights, not the files
    that hold them: the same tensors sharded otherwise, or written in another order, hash alike; the same weights at
    another dtype do not."""
    tensors = {}
    for file in _weight_files(resolve_checkpoint_dir(path_or_hub_id)):
        with open(file, "rb") as f:  # safetensors: an 8-byte header length, the JSON header, then the data
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        tensors.update({name: (file, 8 + size, info) for name, info in header.items()
                        if name != "__metadata__" and not name.startswith(MTP_PREFIX)})
    digest = hashlib.sha256()
    for name in sorted(tensors):
        file, data, info = tensors[name]
        begin, end = info["data_offsets"]
        digest.update(f"{name} {info['dtype']} {info['shape']}\n".encode())
        with open(file, "rb") as f:
            f.seek(data + begin)
            for offset in range(begin, end, BLOCK_BYTES):
                chunk = f.read(min(BLOCK_BYTES, end - offset))
                if not chunk:
                    raise ValueError(f"{file} ends inside tensor {name}")
                digest.update(chunk)
    return digest.hexdigest()


def _looks_like_hub_id(name: str) -> bool:
    """`owner/name` or `name` as the hub spells them; anything path-like (./x, /x, a/b/c) is a local path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id  # only for names that are not directories

    if name.startswith((".", "/", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def resolve_checkpoint_dir(path_or_hub_id: str | os.PathLike) -> Path:
    """The local directory of a checkpoint: `path_or_hub_id` itself when it is a directory, else the snapshot of
    that Hugging Face hub id (downloaded, or found in the cache when offline) with its config, weights and tokenizer
    files. Callers load the tokenizer from the same directory. One-line FileNotFoundError when neither exists."""
    path = Path(path_or_hub_id).expanduser()
    if path.is_dir():
        return path
    name = str(path_or_hub_id)
    if path.exists():
        raise FileNotFoundError(f"checkpoint path {path} is not a directory")
    if not _looks_like_hub_id(name):
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, allow_patterns=HUB_FILES))
    except (OSError, ValueError) as error:  # offline, unknown, gated, or no network: hub errors are OSErrors
        reason = " ".join(str(error).split())
        raise FileNotFoundError(f"checkpoint {name!r} is not a local directory, and the Hugging Face hub could not "
                                f"provide it: {reason}") from None


# Where a checkpoint tensor lies, and its shape: (file, name in the file, shape).
TensorRef = tuple[Path, str, tuple[int, ...]]


def _tensor_index(files: list[Path]) -> dict[str, TensorRef]:
    """name -> where it lies, for every tensor of `files`, read from their headers only."""
    index: dict[str, TensorRef] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                index[name] = (file, name, tuple(f.get_slice(name).get_shape()))
    return index


def _check_names(module: torch.nn.Module, index: dict[str, TensorRef], what: str, skip: set[str]) -> None:
    """Name every missing, unexpected or mis-shaped tensor of a checkpoint against `module`'s state_dict (meta
    tensors do: only shapes are read)."""
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items() if k not in skip}
    missing = sorted(set(expected) - set(index))
    unexpected = sorted(set(index) - set(expected) - skip)
    if missing:
        raise ValueError(f"{what}: missing tensors {missing}")
    if unexpected:
        raise ValueError(f"{what}: unexpected tensors {unexpected}")
    shapes = [f"{k}: checkpoint {index[k][2]}, model {shape}" for k, shape in expected.items() if index[k][2] != shape]
    if shapes:
        raise ValueError(f"{what}: mis-shaped tensors: " + "; ".join(shapes))


def _materialise(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """A module built on the meta device gets uninitialised host tensors in `dtype`: no random init to overwrite,
    no fp32 copy of a bf16 model, and pages that only count once the checkpoint's values are written to them."""
    module.to(dtype).to_empty(device="cpu")


def _copy_tensor(file: Path, name: str, target: torch.Tensor) -> None:
    """target.copy_(the tensor `name` of `file`), cast to target's dtype, in blocks of rows of at most BLOCK_BYTES.

    safetensors maps the file, and the mapped pages a read touches count as this process's memory until the
    mapping closes; a mapping per block keeps that to one block, where one held open for the whole load would grow
    into a second copy of the checkpoint (and one per tensor, to the largest tensor: the embedding)."""
    if target.dim() == 0:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            target.copy_(f.get_tensor(name))
        return
    rows = max(1, BLOCK_BYTES // max(1, target[0].numel() * 4))  # 4: the widest dtype a checkpoint stores here
    for start in range(0, target.shape[0], rows):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            target[start:start + rows].copy_(f.get_slice(name)[start:start + rows])


def _fill(module: torch.nn.Module, index: dict[str, TensorRef], skip: set[str] = frozenset()) -> None:
    """Copy the checkpoint's tensors into `module` (checked by `_check_names`), cast to its dtype, straight from
    the files. The fused projections' state_dict entries are row views of q/k/v and gate/up, so the parts land in
    place, with no concatenated copy."""
    with torch.no_grad():
        for k, target in module.state_dict().items():
            if k not in skip:
                _copy_tensor(*index[k][:2], target)


def load_pretrained(path_or_hub_id: str | os.PathLike, *, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> tuple[Transformer, MTPHead | None]:
    """Read a Hugging Face layout directory or hub id -> (model, mtp head or None when it stores no mtp.* tensors).

    `dtype` defaults to the checkpoint's torch_dtype (float32 if unrecorded); both come back in eval mode."""
    path = resolve_checkpoint_dir(path_or_hub_id)
    if not (path / CONFIG).is_file():
        raise FileNotFoundError(f"{path} has no {CONFIG}")
    hf = json.loads((path / CONFIG).read_text())
    config = ModelConfig.from_hf_dict(hf)
    index = _tensor_index(_weight_files(path))
    if dtype is None:
        dtype = _parse_dtype(str(hf.get("torch_dtype") or hf.get("dtype") or "float32"), path / CONFIG)
    head_index = {k[len(MTP_PREFIX):]: index.pop(k) for k in list(index) if k.startswith(MTP_PREFIX)}
    draft_ids = _read_draft_ids(head_index, path)
    meta = hf.get("bebop_mtp") or {}
    with torch.device("meta"):
        model = Transformer(config)
        mtp = _head_from_meta(config, meta)
    # A tied checkpoint may still carry lm_head.weight; the tie makes it the embedding, so it is skipped.
    skip = {"lm_head.weight"} if config.tie_word_embeddings else set()
    _check_names(model, index, f"checkpoint {path}", skip)
    if head_index:
        _check_names(mtp, head_index, f"checkpoint {path} (mtp.* head)", set())
    _materialise(model, dtype)
    model.tie_weights()  # materialising gave the embedding and the LM head a tensor each
    model.init_rope(dtype)  # before the weights: its fp32 scratch is gone by the time they take their memory
    _fill(model, index, skip)
    if head_index:
        _materialise(mtp, dtype)
        _fill(mtp, head_index)
        mtp.use_draft_vocab(draft_ids)
        mtp.name_or_path = str(path_or_hub_id)
    model.name_or_path, model.weights_hash = str(path_or_hub_id), weights_hash(path)
    return model.to(device).eval(), (mtp.to(device).eval() if head_index else None)


def save_head(mtp: MTPHead, path: str | os.PathLike) -> None:
    """Write a head alone to directory `path`: head.safetensors (mtp.* names) + head.json."""
    if not isinstance(mtp, MTPHead):
        raise ValueError(f"mtp must be an MTPHead, got {type(mtp).__name__}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = {**_head_meta(mtp), **{k: getattr(mtp.config, k) for k in HEAD_FIELDS},
            "torch_dtype": _dtype_name(mtp.fc.weight.dtype)}
    _write_tensors(path / HEAD_WEIGHTS, _head_tensors(mtp))
    _write_json(path / HEAD_CONFIG, meta)


def load_head(path: str | os.PathLike, model_config: ModelConfig, *, dtype: torch.dtype | None = None,
              device: torch.device | str | None = None) -> MTPHead:
    """Read a head written by `save_head` for a backbone of `model_config` (layer shapes must agree)."""
    path = Path(path)
    for name in (HEAD_CONFIG, HEAD_WEIGHTS):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path} has no {name} (expected a directory written by save_head)")
    meta = json.loads((path / HEAD_CONFIG).read_text())
    try:  # the head's config is the backbone's with the recorded fields (an older head.json may lack some)
        check_head_fits(replace(model_config, **{k: meta[k] for k in HEAD_FIELDS if k in meta}), model_config)
    except ValueError as error:
        raise ValueError(f"head at {path}: {error}") from None
    index = _tensor_index([path / HEAD_WEIGHTS])
    stray = [k for k in index if not k.startswith(MTP_PREFIX)]
    if stray:
        raise ValueError(f"{path / HEAD_WEIGHTS} holds tensors outside mtp.*: {stray}")
    dtype = dtype or _parse_dtype(str(meta.get("torch_dtype", "float32")), path / HEAD_CONFIG)
    with torch.device("meta"):
        mtp = _head_from_meta(model_config, meta)
    index = {k[len(MTP_PREFIX):]: v for k, v in index.items()}
    draft_ids = _read_draft_ids(index, path / HEAD_WEIGHTS)
    _check_names(mtp, index, f"head {path}", set())
    _materialise(mtp, dtype)
    _fill(mtp, index)
    mtp.name_or_path = str(path)
    return mtp.use_draft_vocab(draft_ids).to(device).eval()
