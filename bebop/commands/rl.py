"""`bebop rl`: GRPO with speculative rollouts from the command line.

    bebop rl --preset quick --task math --rollout rs --mtp frozen --out runs/rl-math-rs
    bebop rl --preset quick --task agent --rollout none --sync --out runs/rl-agent-plain
    bebop rl --out runs/rl-math-rs --resume          # continue a killed run (same flags)

The policy is the embedded default unless `--policy DIR` names a checkpoint in the Hugging Face layout with
its tokenizer; `--head` picks the MTP head: a name of the policy's heads ("e2e_tv", "ce") or a directory
written by `bebop.models.checkpoint.save_head` (`bebop.commands.policy` reads both).
Async is the default mode; `--sync` runs generation and update one after the other.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bebop.commands.policy import HEAD_NAMES, load_policy
from bebop.rl.config import MTP_STRATEGIES, PRESETS, ROLLOUTS, TASKS, RLConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="quick", help=f"one of {list(PRESETS)}")
    parser.add_argument("--task", default="math", help=f"one of {list(TASKS)}")
    parser.add_argument("--rollout", default="rs", help=f"one of {list(ROLLOUTS)} (none = no MTP)")
    parser.add_argument("--mtp", default="frozen", help=f"one of {list(MTP_STRATEGIES)}")
    parser.add_argument("--sync", action="store_true", help="no overlap of generation and update (default: async)")
    parser.add_argument("--out", type=Path, required=True, help="run directory (created; must be new unless --resume)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    parser.add_argument("--policy", type=Path, default=None, help="policy checkpoint dir (default: the embedded default)")
    parser.add_argument("--head", default="e2e_tv", help=f"MTP head: {list(HEAD_NAMES)} or a save_head directory")
    parser.add_argument("--steps", type=int, default=None, help="override the preset's number of steps")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--gamma", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--gen-dtype", choices=("auto", "fp32", "bf16"), default=None,
                        help="the rollout snapshot's dtype (default: the preset's; auto = bf16 where this CPU runs it "
                             "natively, else fp32; bf16 runs on every CPU, slowly where it is emulated)")
    parser.add_argument("--micro-batch-tokens", type=int, default=None,
                        help="computed tokens per update micro-batch of prompt groups (0 = the whole batch at once)")
    parser.add_argument("--name", default=None, help="run name shown by the dashboard (default: the directory name)")
    parser.add_argument("--no-progress", action="store_true")


def config_from_args(args: argparse.Namespace) -> RLConfig:
    overrides = {k: getattr(args, k) for k in ("steps", "seed", "lr", "gamma", "threads", "micro_batch_tokens", "gen_dtype")
                 if getattr(args, k) is not None}
    if args.gamma is not None:
        overrides["mtp_depth"] = args.gamma
    return RLConfig.preset(args.preset, task=args.task, rollout=args.rollout, mtp=args.mtp,
                           mode="sync" if args.sync else "async", **overrides)


def run(args: argparse.Namespace) -> int:
    from bebop.rl.trainer import Trainer

    config = config_from_args(args)  # bad names fail here, before any model is loaded
    model, tokenizer, head = load_policy(args.policy, args.head if config.uses_head else None)
    trainer = Trainer(config, model, tokenizer, head=head, run_dir=args.out, resume=args.resume, name=args.name,
                      progress=not args.no_progress, meta_extra={"head": args.head if config.uses_head else None})
    records = trainer.run()
    if records:
        last = records[-1]
        first = trainer.history[0]
        print(f"{args.out}: steps {first['step']}-{last['step']}, reward {first['critic/score/mean']:.3f} -> "
              f"{last['critic/score/mean']:.3f}, step time {last['timing_s/step']:.2f}s")
    print(f"watch it: streamlit run app/main.py   (run directory: {args.out})")
    return 0
