"""The embedded default: a tiny Qwen3 policy bebop trained on its own tasks, and its MTP draft heads.

    import bebop
    d = bebop.load_default()          # nothing is trained here: the files ship inside the package
    d.model, d.tokenizer, d.heads["ce"], d.heads["e2e_tv"]

Files (package data, bebop/assets/default/):
    config.json, model.safetensors          the policy, Hugging Face layout (bf16)
    tokenizer.json, tokenizer_config.json,   the character tokenizer (HF format)
    special_tokens_map.json
    heads/{objective}/head.json, head.safetensors   one MTP head per training objective (save_head)

How they were made (the commands, in order) and what they measured at shipping: docs/default-model.md.
`bebop eval-mtp --heads ce tv e2e_tv` measures them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# The models (and torch) load in load_default only: the command line's help texts read DEFAULT_DIR and
# shipped_heads without them.
if TYPE_CHECKING:
    import torch

    from bebop.data.tokenizer import CharTokenizer
    from bebop.models.mtp import MTPHead
    from bebop.models.transformer import Transformer

DEFAULT_DIR = Path(__file__).resolve().parent / "assets" / "default"
DEFAULT_NAME = "default"  # what a run calls the embedded default (a job run without --policy; load_default())
HEADS_DIR = DEFAULT_DIR / "heads"
REQUIRED_HEADS = ("ce", "e2e_tv")


@dataclass(frozen=True)
class PolicyBundle:
    """A policy with its tokenizer and MTP heads, as `load_default` and `bebop.policy.load_policy_heads` load them."""

    model: Transformer
    tokenizer: CharTokenizer
    heads: dict[str, MTPHead]  # label -> head; load_default's: objective -> head, "ce" and "e2e_tv" always, "tv" etc.
    # when shipped (load_policy_heads: the heads a job names)
    path: Path  # the directory its files (and heads/) were read from


Default = PolicyBundle  # its earlier name (`bebop.load_default() -> Default`), from when only the default had one


def shipped_heads(path: Path = DEFAULT_DIR) -> list[str]:
    """Objectives with a shipped head under `path`/heads, in a stable order."""
    heads = Path(path) / "heads"
    return sorted(p.name for p in heads.iterdir() if (p / "head.json").is_file()) if heads.is_dir() else []


def load_default(*, dtype: torch.dtype | str | None = None, device: torch.device | str | None = None,
                 path: str | Path | None = None) -> PolicyBundle:
    """Load the shipped policy, tokenizer and heads (bf16 where the CPU is fast at it, else fp32)."""
    from bebop.data.tokenizer import load_tokenizer
    from bebop.device import resolve_dtype
    from bebop.models.checkpoint import load_head, load_pretrained

    root = Path(path) if path is not None else DEFAULT_DIR
    if not (root / "config.json").is_file():
        raise FileNotFoundError(f"no default checkpoint at {root}: reinstall bebop or run `bebop pretrain --out {root}`")
    dtype = resolve_dtype(dtype, device or "cpu")
    model, _ = load_pretrained(root, dtype=dtype, device=device)
    names = shipped_heads(root)
    missing = [n for n in REQUIRED_HEADS if n not in names]
    if missing:
        raise FileNotFoundError(f"{root / 'heads'} lacks the heads {missing}; train them with `bebop train-mtp`")
    heads = {n: load_head(root / "heads" / n, model.config, dtype=dtype, device=device) for n in names}
    if path is None:  # the names a job gives them (bebop.policy), for the runs they make
        model.name_or_path = DEFAULT_NAME
        for name, head in heads.items():
            head.name_or_path = name
    return PolicyBundle(model=model, tokenizer=load_tokenizer(root), heads=heads, path=root)
