"""`bebop pretrain`: train the tiny Qwen3 policy on task demonstrations (the embedded default; how:
`bebop.pretrain`).

The shipped policy in `bebop/assets/default/` was produced by the defaults (seed 0):

    bebop pretrain --out bebop/assets/default --run-dir runs/pretrain-default
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from bebop.commands.device_args import add_device_args
from bebop.commands.outputs import check_out, check_run_dir
from bebop.pretrain import PretrainConfig


# Flags that set a PretrainConfig field of the same name: given, they override the preset (default or --tiny).
FIELDS = {"steps": "optimiser steps", "batch_size": "demonstrations per step", "lr": "peak learning rate",
          "error_rate": "fraction of deliberately wrong demonstrations", "eval_every": "evaluation every N steps",
          "eval_prompts": "held-out prompts per task", "seed": "seed of the data and the initialisation",
          "threads": "torch threads", "warmup": "linear warmup steps"}


def _default(field: str) -> str:
    full, tiny = getattr(PretrainConfig(), field), getattr(PretrainConfig.tiny(), field)
    return f"default: {full}" + ("" if tiny == full else f"; with --tiny: {tiny}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None,
                        help="checkpoint directory (HF layout + tokenizer); must hold nothing unless --force")
    parser.add_argument("--force", action="store_true",
                        help="replace the checkpoint already in --out (default: refuse)")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="run directory, a new one: pretraining keeps no checkpoint and cannot be resumed "
                             "(--init continues from a saved policy) (default: runs/pretrain-<time>)")
    parser.add_argument("--tasks", nargs="+", default=list(PretrainConfig.tasks),
                        help="task families to train on (default: %(default)s)")
    for field, what in FIELDS.items():
        kind = type(getattr(PretrainConfig(), field))
        parser.add_argument(f"--{field.replace('_', '-')}", type=kind, default=None, help=f"{what} ({_default(field)})")
    parser.add_argument("--init", type=Path, default=None, help="continue from this policy checkpoint (default: none)")
    parser.add_argument("--tiny", action="store_true",
                        help="the tiny test preset (seconds); flags given beside it override its values")
    add_device_args(parser, dtype_help="the autocast dtype (float32 master weights)", dtype_aliases=("--autocast",))


def config_from_args(args: argparse.Namespace) -> PretrainConfig:
    """The CLI's config: the preset (--tiny or the default) with every flag given applied over it."""
    base = PretrainConfig.tiny() if args.tiny else PretrainConfig()
    given = {field: getattr(args, field) for field in FIELDS if getattr(args, field) is not None}
    if "lr" in given:
        given["min_lr"] = min(base.min_lr, given["lr"])
    return dataclasses.replace(base, **given, tasks=tuple(args.tasks), dtype=args.dtype, device=args.device,
                               init=None if args.init is None else str(args.init))


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    check_out(args.out, "--out", force=args.force, holds="a checkpoint")
    check_run_dir(args.run_dir, resume=False, resumable=False)
    from bebop import pretrain as library  # torch: once the flags are checked
    from bebop.runlog.session import default_run_dir, open_session

    run_dir = args.run_dir or default_run_dir("pretrain")
    library.pretrain(config, open_session(run_dir, config, kind="pretrain"), args.out)  # --device cuda w/o CUDA: here
    print(f"run directory: {run_dir}" + (f"\ncheckpoint: {args.out}" if args.out else ""))
    return 0
