"""`bebop pretrain`: train the tiny Qwen3 policy on task demonstrations (the embedded default; how:
`bebop.pretrain`).

The shipped policy in `bebop/assets/default/` was produced by the defaults (seed 0):

    bebop pretrain --out bebop/assets/default --run-dir runs/pretrain-default
    bebop pretrain --run-dir runs/pretrain-default --resume    # continue a stopped run as it was recorded
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bebop.commands.device_args import add_device_args
from bebop.commands.flags import preset_or_record
from bebop.commands.outputs import check_out, check_run_dir
from bebop.pretrain import PretrainConfig


# Flags that set a PretrainConfig field of the same name: given, they override the preset (default or --tiny).
FIELDS = {"steps": "optimiser steps", "batch_size": "demonstrations per step", "lr": "peak learning rate",
          "error_rate": "fraction of deliberately wrong demonstrations", "eval_every": "evaluation every N steps",
          "eval_prompts": "held-out prompts per task", "seed": "seed of the data and the initialisation",
          "threads": "torch threads", "warmup": "linear warmup steps",
          "checkpoint_every": "steps between resumable checkpoints in --run-dir (0: only at the end)"}


def _default(field: str) -> str:
    full, tiny = getattr(PretrainConfig(), field), getattr(PretrainConfig.tiny(), field)
    return f"default: {full}" + ("" if tiny == full else f"; with --tiny: {tiny}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None,
                        help="checkpoint directory (HF layout + tokenizer); must hold nothing unless --force")
    parser.add_argument("--force", action="store_true",
                        help="replace the checkpoint already in --out (default: refuse)")
    parser.add_argument("--run-dir", type=Path, default=None, help="run directory (default: runs/pretrain-<time>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --run-dir from its last checkpoint, with the settings (and --out) it "
                             "recorded; a flag given beside it may change only --steps, --threads, --eval-every and "
                             "--checkpoint-every (default: a new run)")
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
    return config_and_note(args)[0]


def config_and_note(args: argparse.Namespace) -> tuple[PretrainConfig, str | None]:
    """The preset (--tiny or the default) with every flag given applied over it; with --resume, the run's recorded
    config with the flags given held against it, and the line that says what they changed
    (`bebop.commands.flags.resumed`)."""
    base = PretrainConfig.tiny() if args.tiny else PretrainConfig()
    fields = {field: getattr(args, field) for field in FIELDS if getattr(args, field) is not None}
    if "lr" in fields:
        fields["min_lr"] = min(base.min_lr, fields["lr"])
    fields.update(tasks=tuple(args.tasks), dtype=args.dtype, device=args.device,
                  init=None if args.init is None else str(args.init))
    return preset_or_record(base, fields, args)


def _out(args: argparse.Namespace) -> Path | None:
    """Where the policy goes: --out, or resumed, the --out the run recorded when none is given. Its own policy,
    saved there at its evals, is what a resumed run may replace without --force."""
    meta = args.run_dir / "meta.json" if args.resume and args.run_dir is not None else None
    recorded = json.loads(meta.read_text()).get("out") if meta is not None and meta.is_file() else None
    out = args.out if args.out is not None or recorded is None else Path(recorded)
    own = recorded is not None and out is not None and out.resolve() == Path(recorded).resolve()
    check_out(out, "--out", force=args.force or own, holds="a checkpoint")
    return out


def run(args: argparse.Namespace) -> int:
    config, note = config_and_note(args)  # bad names, values and resumes fail here, before torch loads
    check_run_dir(args.run_dir, resume=args.resume)
    out = _out(args)
    from bebop import pretrain as library  # torch: once the flags are checked

    session = library.open_run(args.run_dir, config, resume=args.resume, progress=True)  # --device cuda w/o CUDA: here
    args.run_dir = session.run_dir  # what a --resume names
    if note:
        print(f"bebop pretrain: {note}", file=sys.stderr)
    library.pretrain(config, session, out)
    print(f"run directory: {session.run_dir}" + (f"\ncheckpoint: {out}" if out else ""))
    return 0
