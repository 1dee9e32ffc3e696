"""`bebop train-mtp`: pre-RL MTP draft-head training on a frozen policy (PAPER §4).

    bebop train-mtp --policy bebop/assets/default --objective e2e_tv --depth 5 --temperature 1.0 \\
        --out bebop/assets/default/heads/e2e_tv
    bebop train-mtp --policy smollm2 --draft-vocab 8192 ...   # a head over a draft vocabulary of 8,192 ids

The recipe (data, frozen backbone, target at the rollout temperature, optimiser) and the run directory it writes are
`bebop.heads.train`'s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bebop.commands.device_args import add_device_args
from bebop.commands.flags import preset_or_record
from bebop.commands.outputs import check_out, check_run_dir
from bebop.commands.prompt_args import add_prompt_args, prompt_fields
from bebop.heads.config import OBJECTIVES, TrainMTPConfig
from bebop.policy import POLICY_HELP, check_policy, resolve_head
from bebop.runlog.mirror import add_mirror_arguments, mirrors_from_args


# Flags that set a field of TrainMTPConfig of the same name: given, they override the preset (default or --tiny);
# left out, the preset's value holds (so --tiny --steps 40 trains 40 steps, and a bad value is refused either way).
FIELDS = {"objective": None, "depth": "γ_train recursive draft steps", "temperature": "rollout temperature",
          "num_sequences": "self-generated sequences, all tasks together",
          "max_new_tokens": "tokens per self-generated completion", "steps": "optimiser steps",
          "batch_size": "sequences per step",
          "length_bucket": "each batch's length rounded up to a multiple of this (fewer shapes: less heap)",
          "lr": "peak learning rate (AdamW)",
          "warmup_frac": "linear warmup, fraction of steps",
          "lr_schedule": "after the warmup: constant, or cosine down to 0 at the last step", "grad_clip": "max gradient norm",
          "eval_every": "held-out evaluation every N steps",
          "checkpoint_every": "steps between checkpoints in the run directory, 0 = only at the end",
          "seed": "seed of the data and the head's initialisation", "threads": "torch threads",
          "corpus_head": "a head that drafts while the policy writes the corpus, verified by RS (exact: the answers "
                         "keep the policy's distribution); a name under the policy's heads/, a directory or lookup",
          "corpus_gamma": "draft depth while generating the corpus with --corpus-head: an int or auto",
          "corpus_rows": "prompts per engine call while generating the corpus"}


def _gamma(text: str) -> int | str:
    return text if text == "auto" else int(text)


# Flags whose type is not their default's
KINDS = {"corpus_head": str, "corpus_gamma": _gamma}


def _default(field: str) -> str:
    def shown(value) -> str:
        return " ".join(value) if isinstance(value, tuple) else str(value)

    full, tiny = getattr(TrainMTPConfig(), field), getattr(TrainMTPConfig.tiny(), field)
    return f"default: {shown(full)}" + ("" if tiny == full else f"; with --tiny: {shown(tiny)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default=None, help=f"{POLICY_HELP} (default: the embedded default)")
    parser.add_argument("--objective", default=TrainMTPConfig.objective,
                        help=f"the head's loss, one of {', '.join(OBJECTIVES)} (default: %(default)s)")
    for field, what in FIELDS.items():
        if what is not None:
            kind = KINDS.get(field, type(getattr(TrainMTPConfig(), field)))
            parser.add_argument(f"--{field.replace('_', '-')}", type=kind, default=None,
                                help=f"{what} ({_default(field)})")
    parser.add_argument("--tasks", nargs="+", default=None,
                        help="built-in tasks and/or datasets (jsonl:PATH, parquet:PATH, a save_to_disk directory, gym:NAME?...) "
                             f"the policy answers for the head's training data ({_default('tasks')})")
    add_prompt_args(parser)
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --run-dir from its last checkpoint, with the settings it recorded; a "
                             "flag given beside it may change only --steps, --threads, --eval-every and "
                             "--checkpoint-every (default: a new run)")
    parser.add_argument("--init", type=Path, default=None, help="adapt this head directory instead of a fresh head")
    parser.add_argument("--data", type=Path, default=None,
                        help="the corpus cache directory: each task's self-generated answers, reused by every later "
                             "run on the same policy and settings (default: $BEBOP_CACHE/corpus)")
    parser.add_argument("--draft-vocab", type=int, default=None, metavar="K",
                        help="draft over the K ids carrying the most of the policy's probability on the corpus, its "
                             "stop ids included (EAGLE-3's draft vocabulary): a step and a draft cost K/V of the LM "
                             "head (default: the whole vocabulary; with --init, the init head's)")
    parser.add_argument("--feature-layers", type=int, nargs="+", default=None, metavar="LAYER",
                        help="fused features (EAGLE-3's): the head also reads these decoder layers' residual streams "
                             "(0-based, increasing, below the last), through a learned projection with the top hidden "
                             "(default: the top hidden alone; with --init, the init head's; a top-layer --init head "
                             "grows the projection, starting as itself)")
    parser.add_argument("--head-layers", type=int, default=None, metavar="N",
                        help="decoder layers stacked in the head's block (default: 1; with --init, the init head's; a "
                             "shallower --init head grows the layers, each starting as the identity)")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for the trained head (save_head); must hold no head unless --force")
    parser.add_argument("--force", action="store_true", help="replace the head already in --out (default: refuse)")
    parser.add_argument("--run-dir", type=Path, default=None, help="run directory (default runs/train-mtp-<time>)")
    parser.add_argument("--tiny", action="store_true",
                        help="the tiny test preset (seconds); flags given beside it override its values")
    add_device_args(parser, dtype_help="the compute dtype of the backbone's hidden states and the head (float32 "
                                       "master weights under autocast)", dtype_aliases=("--autocast",))
    add_mirror_arguments(parser)


def config_from_args(args: argparse.Namespace) -> TrainMTPConfig:
    return config_and_note(args)[0]


def config_and_note(args: argparse.Namespace) -> tuple[TrainMTPConfig, str | None]:
    """The preset (--tiny or the default) with every flag given applied over it; with --resume, the run's recorded
    config with the flags given held against it, and the line that says what they changed
    (`bebop.commands.flags.resumed`)."""
    base = TrainMTPConfig.tiny(args.objective) if args.tiny else TrainMTPConfig(objective=args.objective)
    return preset_or_record(base, _flag_fields(args), args)


def _flag_fields(args: argparse.Namespace) -> dict:
    """TrainMTPConfig field -> value of each flag that sets one (numbers left out are the preset's)."""
    fields = {field: getattr(args, field) for field in FIELDS if getattr(args, field) is not None}
    if args.tasks is not None:
        fields["tasks"] = tuple(args.tasks)
    if args.draft_vocab is not None:
        fields["draft_vocab"] = args.draft_vocab
    if args.feature_layers is not None:
        fields["feature_layers"] = tuple(args.feature_layers)
    if args.head_layers is not None:
        fields["head_layers"] = args.head_layers
    return {**fields, "dtype": args.dtype, "device": args.device,
            "init_head": None if args.init is None else str(args.init), **prompt_fields(args)}


def run(args: argparse.Namespace) -> int:
    """One process, or one rank of `torchrun --nproc-per-node N -m bebop train-mtp ...`."""
    config, note = config_and_note(args)  # bad names, values and resumes fail here, before torch loads
    check_out(args.out, "--out", force=args.force, holds="a head")
    check_run_dir(args.run_dir, resume=args.resume)
    mirrors = mirrors_from_args(args)  # a missing tensorboard / wandb package fails here, before any work
    from bebop.heads.step import check_init_layers

    check_init_layers(config)  # a --head-layers that would cut the --init head, before the policy loads
    from bebop import distributed
    from bebop.data.tasks import dataset_config
    from bebop.data.tasks import get as get_task
    from bebop.device import resolve_device
    from bebop.heads.corpus import CorpusSource
    from bebop.heads.train import load_frozen_policy, open_run, train_mtp

    # Each dataset read once, before the policy loads.
    tasks = {n: get_task(n, dataset_config(config)) for n in config.tasks}
    distributed.init(resolve_device(config.device))  # --device cuda without CUDA: one line, before the policy loads
    session = open_run(args.run_dir, config, resume=args.resume, mirrors=mirrors, progress=True)
    args.run_dir = session.run_dir  # what a --resume names
    model, tokenizer = load_frozen_policy(args.policy)
    # the head that drafts while the policy writes the corpus (its dtype follows the sampler's there)
    drafter = None if config.corpus_head is None else resolve_head(config.corpus_head, model, check_policy(args.policy))
    if note and distributed.is_main():
        print(f"bebop train-mtp: {note}", file=sys.stderr)
    start = time.perf_counter()
    train_mtp(model, tokenizer, config, session, data=CorpusSource(args.data, tasks=tasks, drafter=drafter),
              out=args.out)
    main = distributed.is_main()
    distributed.finish()  # not after an error: the other ranks may be inside a collective (torchrun stops them)
    if not main:
        return 0
    print(f"trained {config.objective} head in {time.perf_counter() - start:.0f} s; run directory: {args.run_dir}"
          + (f"; head: {args.out}" if args.out else ""))
    return 0
