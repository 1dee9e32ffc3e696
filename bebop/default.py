"""The embedded default: a tiny Qwen3 policy bebop trained on its own tasks, and its MTP draft heads.

    import bebop
    d = bebop.load_default()          # nothing is trained here: the files ship inside the package
    d.model, d.tokenizer, d.heads["ce"], d.heads["e2e_tv"]

Files (package data, bebop/assets/default/):
    config.json, model.safetensors          the policy, Hugging Face layout (bf16)
    tokenizer.json, tokenizer_config.json,   the character tokenizer (HF format)
    special_tokens_map.json
    heads/{objective}/head.json, head.safetensors   one MTP head per training objective (save_head)

How they were made (seed 0 throughout, one thread; see bebop.commands.pretrain and bebop.commands.train_mtp):
    bebop pretrain --out bebop/assets/default
    D="--num-sequences 4800 --data runs/heads-v2/mtp-data-4800.pt --eval-every 100 --threads 1 --steps 500"
    # a CE base head trained until its held-out d_TV flattens, standing in for the MTP head a released
    # checkpoint ships with: 2000 steps in four calls (each call restarts AdamW and its warmup) ...
    bebop train-mtp --objective ce $D --out runs/heads-v2/heads/base-500
    for n in 1000 1500 2000; do
        bebop train-mtp --objective ce $D --init runs/heads-v2/heads/base-$((n - 500)) \\
            --out runs/heads-v2/heads/base-$n
    done
    # ... then each loss adapts it for the same 1500 steps (two calls), same data, same settings:
    for obj in tv e2e_tv ce; do
        bebop train-mtp --objective $obj $D --init runs/heads-v2/heads/base-2000 --out runs/heads-v2/heads/$obj
        bebop train-mtp --objective $obj $D --steps 1000 --init runs/heads-v2/heads/$obj \
            --out bebop/assets/default/heads/$obj
    done
(every call: batches of 16 sequences, depth 5, T=1, AdamW at a constant lr 1e-3 after a 3% warmup, bf16
autocast, clip 1.0, reached only early in the base's first call.) 4800 self-generated sequences, not 480:
on 480 (27k policy tokens) a CE head's training-batch d_TV was 0.11 against 0.20 held out after 750
steps, memorisation; on 4800 the base's held-out d_TV goes 0.195 / 0.148 / 0.120 / 0.103 after 500 /
1000 / 1500 / 2000 steps (still falling, by less each call).
Held-out (all tasks) after 500 adaptation steps, then after 1500: mean d_TV over the 5 depths 0.095 -> 0.087
(ce), 0.086 -> 0.067 (tv), 0.085 -> 0.070 (e2e_tv); teacher-forced accept length at gamma=3 3.51 -> 3.55,
3.55 -> 3.65, 3.58 -> 3.65. The 1000 further steps were shipped by a rule fixed before their acceptance was
measured: ship them if every head's held-out d_TV improved.
What they show on math (table, Table 2 layout, entropy-law fits): `bebop eval-mtp --heads ce tv e2e_tv`.
Measured at shipping (the sweeps of tests/test_eval_mtp.py, gamma=3, T=1), RS / TO acceptance (%):

                                    ce            tv            e2e_tv
    96 held-out math prompts        73.9 / 67.1   78.3 / 67.6   78.6 / 68.6
    384 further prompts (seed 2)    76.1 / 67.0   78.3 / 68.2   79.4 / 68.9

Under RS e2e TV > TV > CE, +3.2 points over CE on the 384 prompts; under TO the losses spread 1.9 points
(not < 1). Across T = 0.4-1.3 (48 prompts off T=1) TO falls with the policy's entropy (ce -0.33, e2e_tv
-0.52 per nat), RS less (ce -0.19, e2e_tv -0.14); only TO+e2e_tv's bootstrap interval over the four
temperatures excludes 0 (tests/test_eval_mtp.py marks the claims that do not hold).

The policy at T=1 solves about 6% of held-out math, 9% of code and 39% of agent prompts (20% of math at
T=0.5), with 0.12-0.30 nats of entropy per generated token: weak enough for RL to improve a lot.
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
HEADS_DIR = DEFAULT_DIR / "heads"
REQUIRED_HEADS = ("ce", "e2e_tv")


@dataclass(frozen=True)
class Default:
    model: Transformer
    tokenizer: CharTokenizer
    heads: dict[str, MTPHead]  # label -> head; load_default's: objective -> head, "ce" and "e2e_tv" always, "tv" etc.
    # when shipped (bebop.commands.policy.load_policy_heads fills the same bundle with the heads a job names)
    path: Path


def shipped_heads(path: Path = DEFAULT_DIR) -> list[str]:
    """Objectives with a shipped head under `path`/heads, in a stable order."""
    heads = Path(path) / "heads"
    return sorted(p.name for p in heads.iterdir() if (p / "head.json").is_file()) if heads.is_dir() else []


def load_default(*, dtype: torch.dtype | str | None = None, device: torch.device | str | None = None,
                 path: str | Path | None = None) -> Default:
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
    return Default(model=model, tokenizer=load_tokenizer(root), heads=heads, path=root)
