"""`bebop pretrain`: train the tiny Qwen3 policy on task demonstrations (the embedded default; how:
`bebop.pretrain`).

The shipped policy in `bebop/assets/default/` was produced by the defaults (seed 0):

    bebop pretrain --out bebop/assets/default --run-dir runs/pretrain-default
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from bebop.commands.device_args import add_device_args
from bebop.device import resolve_device
from bebop.pretrain import PretrainConfig, pretrain


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = PretrainConfig()
    parser.add_argument("--out", type=Path, default=None, help="checkpoint directory (HF layout + tokenizer)")
    parser.add_argument("--run-dir", type=Path, default=None, help="run directory (default runs/pretrain-<time>)")
    parser.add_argument("--tasks", nargs="+", default=list(d.tasks), help="task families to train on")
    parser.add_argument("--steps", type=int, default=d.steps)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--error-rate", type=float, default=d.error_rate)
    parser.add_argument("--eval-every", type=int, default=d.eval_every)
    parser.add_argument("--eval-prompts", type=int, default=d.eval_prompts)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--threads", type=int, default=d.threads)
    parser.add_argument("--init", type=Path, default=None, help="continue from this policy checkpoint")
    parser.add_argument("--warmup", type=int, default=d.warmup)
    parser.add_argument("--tiny", action="store_true", help="the tiny test preset (seconds)")
    add_device_args(parser, dtype_help="the autocast dtype (float32 master weights)", dtype_aliases=("--autocast",))


def config_from_args(args: argparse.Namespace) -> PretrainConfig:
    """The CLI's config: defaults (or the tiny preset's sizes with --tiny) overridden by the flags given."""
    if args.tiny:
        return dataclasses.replace(PretrainConfig.tiny(), tasks=tuple(args.tasks), seed=args.seed, device=args.device,
                                   autocast=args.dtype)
    return PretrainConfig(tasks=tuple(args.tasks), steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                          min_lr=min(PretrainConfig.min_lr, args.lr), error_rate=args.error_rate,
                          eval_every=args.eval_every, eval_prompts=args.eval_prompts, seed=args.seed,
                          autocast=args.dtype, threads=args.threads, warmup=args.warmup, device=args.device,
                          init=None if args.init is None else str(args.init))


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    resolve_device(config.device)  # --device cuda without CUDA fails here, before any work
    run_dir = args.run_dir or Path("runs") / f"pretrain-{time.strftime('%Y%m%d-%H%M%S')}"
    pretrain(config, run_dir, args.out)
    print(f"run directory: {run_dir}" + (f"\ncheckpoint: {args.out}" if args.out else ""))
    return 0

