"""The embedded default: a tiny Qwen3 policy bebop trained on its own tasks, and its MTP draft heads.

    import bebop
    d = bebop.load_default()          # nothing is trained here: the files ship inside the package
    d.model, d.tokenizer, d.heads["ce"], d.heads["e2e_tv"]

Files (package data, bebop/assets/default/):
    config.json, model.safetensors          the policy, Hugging Face layout (bf16)
    tokenizer.json, tokenizer_config.json,   the character tokenizer (HF format)
    special_tokens_map.json
    heads/{objective}/head.json, head.safetensors   one MTP head per training objective (save_head)

How they were made (seed 0 throughout; see bebop.pretrain and bebop.train_mtp):
    bebop pretrain --out bebop/assets/default
    # a CE-trained base head, standing in for the MTP head a released checkpoint ships with ...
    bebop train-mtp --objective ce --data runs/mtp-data.pt --out runs/heads/base
    # ... adapted with each loss on the same self-generated samples, for the same number of steps:
    for obj in tv ce e2e_tv:
        bebop train-mtp --objective $obj --init runs/heads/base --data runs/mtp-data.pt --out runs/heads/$obj-1
        bebop train-mtp --objective $obj --init runs/heads/$obj-1 --data runs/mtp-data.pt \\
            --out bebop/assets/default/heads/$obj
(each train-mtp is 250 steps of 16 sequences at depth 5, T=1; the second call restarts AdamW and its warmup).
What they show on math (table, Table 2 layout, entropy-law fits): `bebop eval-mtp --heads ce tv e2e_tv`.
Measured at shipping (96 held-out math prompts, gamma=3): at T=1 RS accepts 56.1% (ce), 59.7% (tv),
53.6% (e2e_tv); TO 53.4 / 53.5 / 48.6%; RS beats TO for every head at every T in 0.4-1.3. TO falls with
the policy's entropy (-0.29..-0.32 per nat), RS less (-0.19..-0.22) but not flat, and the e2e TV head
is behind the per-step TV head: on this budget it has not converged (tests/test_eval_mtp.py marks the
claims that do not hold yet).

The policy at T=1 solves about 6% of held-out math, 9% of code and 39% of agent prompts (20% of math at
T=0.5), with 0.12-0.30 nats of entropy per generated token: weak enough for RL to improve a lot.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from bebop.checkpoint import load_head, load_pretrained
from bebop.device import resolve_dtype
from bebop.model import Transformer
from bebop.mtp import MTPHead
from bebop.tokenizer import CharTokenizer, load_tokenizer

DEFAULT_DIR = Path(__file__).resolve().parent / "assets" / "default"
HEADS_DIR = DEFAULT_DIR / "heads"
REQUIRED_HEADS = ("ce", "e2e_tv")


@dataclass(frozen=True)
class Default:
    model: Transformer
    tokenizer: CharTokenizer
    heads: dict[str, MTPHead]  # objective -> head: "ce" and "e2e_tv" always, "tv" etc. when shipped
    path: Path


def shipped_heads(path: Path = DEFAULT_DIR) -> list[str]:
    """Objectives with a shipped head under `path`/heads, in a stable order."""
    heads = Path(path) / "heads"
    return sorted(p.name for p in heads.iterdir() if (p / "head.json").is_file()) if heads.is_dir() else []


def load_default(*, dtype: torch.dtype | str | None = None, device: torch.device | str | None = None,
                 path: str | Path | None = None) -> Default:
    """Load the shipped policy, tokenizer and heads (bf16 where the CPU is fast at it, else fp32)."""
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
    return Default(model=model, tokenizer=load_tokenizer(root), heads=heads, path=root)
