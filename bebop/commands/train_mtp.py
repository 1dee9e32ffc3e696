"""`bebop train-mtp`: pre-RL MTP draft-head training on a frozen policy (PAPER §4).

    bebop train-mtp --policy bebop/assets/default --objective e2e_tv --depth 5 --temperature 1.0 \\
        --out bebop/assets/default/heads/e2e_tv
    bebop train-mtp --policy smollm2 --draft-vocab 8192 ...   # a head over a draft vocabulary of 8,192 ids

The recipe (data, frozen backbone, target at the rollout temperature, optimiser) and the run directory it writes are
`bebop.heads.train`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from bebop import distributed
from bebop.commands.device_args import add_device_args
from bebop.commands.prompt_args import add_prompt_args, prompt_fields
from bebop.data.tasks import dataset_config
from bebop.data.tasks import get as get_task
from bebop.device import resolve_device
from bebop.heads.config import TrainMTPConfig
from bebop.heads.train import load_frozen_policy, train_mtp
from bebop.losses import OBJECTIVES
from bebop.policy import POLICY_HELP
from bebop.runlog.mirror import add_mirror_arguments, mirrors_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TrainMTPConfig()
    parser.add_argument("--policy", default=None, help=f"{POLICY_HELP} (default: the embedded default)")
    parser.add_argument("--objective", default=d.objective, help=f"one of {', '.join(OBJECTIVES)}")
    parser.add_argument("--depth", type=int, default=d.depth, help="γ_train recursive draft steps")
    parser.add_argument("--temperature", type=float, default=d.temperature, help="rollout temperature")
    parser.add_argument("--tasks", nargs="+", default=list(d.tasks),
                        help="built-in tasks and/or datasets (jsonl:PATH, parquet:PATH, a save_to_disk directory, "
                             "gym:NAME?...) the policy answers for the head's training data (default: %(default)s)")
    add_prompt_args(parser)
    parser.add_argument("--num-sequences", type=int, default=d.num_sequences)
    parser.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="per self-generated completion")
    parser.add_argument("--steps", type=int, default=d.steps)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--warmup-frac", type=float, default=d.warmup_frac, help="linear warmup, fraction of steps")
    parser.add_argument("--grad-clip", type=float, default=d.grad_clip, help="max gradient norm")
    parser.add_argument("--eval-every", type=int, default=d.eval_every, help="held-out evaluation every N steps")
    parser.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                        help="steps between checkpoints in the run directory, 0 = only at the end (default: %(default)s)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --run-dir from its last checkpoint (default: a new run)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--threads", type=int, default=d.threads)
    parser.add_argument("--init", type=Path, default=None, help="adapt this head directory instead of a fresh head")
    parser.add_argument("--data", type=Path, default=None,
                        help="the corpus cache directory: each task's self-generated answers, reused by every later "
                             "run on the same policy and settings (default: $BEBOP_CACHE/corpus)")
    parser.add_argument("--draft-vocab", type=int, default=None, metavar="K",
                        help="draft over the K ids carrying the most of the policy's probability on the corpus, its "
                             "stop ids included (EAGLE-3's draft vocabulary): a step and a draft cost K/V of the LM "
                             "head (default: the whole vocabulary; with --init, the init head's)")
    parser.add_argument("--out", type=Path, default=None, help="directory for the trained head (save_head)")
    parser.add_argument("--run-dir", type=Path, default=None, help="run directory (default runs/train-mtp-<time>)")
    parser.add_argument("--tiny", action="store_true", help="the tiny test preset (seconds)")
    add_device_args(parser, dtype_help="the compute dtype of the backbone's hidden states and the head (float32 "
                                       "master weights under autocast)", dtype_aliases=("--autocast",))
    add_mirror_arguments(parser)


def config_from_args(args: argparse.Namespace) -> TrainMTPConfig:
    if args.tiny:
        return dataclasses.replace(TrainMTPConfig.tiny(args.objective), device=args.device, autocast=args.dtype,
                                   **prompt_fields(args))
    return dataclasses.replace(
        TrainMTPConfig(objective=args.objective), depth=args.depth, temperature=args.temperature,
        tasks=tuple(args.tasks), num_sequences=args.num_sequences, max_new_tokens=args.max_new_tokens,
        steps=args.steps, batch_size=args.batch_size,
        lr=args.lr, warmup_frac=args.warmup_frac, grad_clip=args.grad_clip, autocast=args.dtype,
        eval_every=args.eval_every, checkpoint_every=args.checkpoint_every, seed=args.seed, threads=args.threads,
        device=args.device,
        init_head=None if args.init is None else str(args.init), draft_vocab=args.draft_vocab, **prompt_fields(args))


def run(args: argparse.Namespace) -> int:
    """One process, or one rank of `torchrun --nproc-per-node N -m bebop train-mtp ...`."""
    config = config_from_args(args)
    if args.resume and (args.run_dir is None or not args.run_dir.is_dir()):
        raise ValueError("--resume continues the run in --run-dir: pass the run directory of an existing run")
    mirrors = mirrors_from_args(args)  # a missing tensorboard / wandb package fails here, before any work
    # Each dataset read once, before the policy loads.
    tasks = {n: get_task(n, dataset_config(config)) for n in config.tasks}
    distributed.init(resolve_device(config.device))  # --device cuda without CUDA: one line, before the policy loads
    model, tokenizer = load_frozen_policy(args.policy)
    run_dir = args.run_dir or Path("runs") / f"train-mtp-{config.objective}-{time.strftime('%Y%m%d-%H%M%S')}"
    # A fresh run's name has the launch time in it; the ranks must agree on rank 0's.
    run_dir = distributed.broadcast_object(run_dir)
    start = time.perf_counter()
    train_mtp(model, tokenizer, config, run_dir, data_path=args.data, out=args.out, mirrors=mirrors,
              resume=args.resume, tasks=tasks)
    main = distributed.is_main()
    distributed.finish()  # not after an error: the other ranks may be inside a collective (torchrun stops them)
    if not main:
        return 0
    print(f"trained {config.objective} head in {time.perf_counter() - start:.0f} s; run directory: {run_dir}"
          + (f"; head: {args.out}" if args.out else ""))
    return 0

