"""`bebop bench coverage`: the soft coverage p(S_K) of draft vocabularies of K ids, on the policy's own samples.

    bebop bench coverage --policy smollm2 --tasks math code --temperatures 0.7 1.0 --sizes 1024 2048 4096 8192 16384

For each temperature the policy answers the tasks' prompts (the corpus `bebop train-mtp` trains on, read from its
cache when a run made it before: `--data`), S_K is chosen on half of the answers and p(S_K) is measured on the
other half (`bebop.heads.coverage`): the most a draft over S_K can accept there. The table gives the mean over the
held-out positions with its standard error (positions within an answer are correlated: the error is a lower bound).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from bebop.commands.device_args import add_device_args
    from bebop.policy import POLICY_HELP

    parser.add_argument("--policy", default=None, help=f"the policy: {POLICY_HELP} (default: the embedded default)")
    parser.add_argument("--tasks", nargs="+", default=["math", "code"],
                        help="tasks whose prompts the policy answers (default: %(default)s)")
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.7, 1.0],
                        help="sampling temperatures, one corpus each (default: %(default)s)")
    parser.add_argument("--sizes", nargs="+", type=int, default=[1024, 2048, 4096, 8192, 16384],
                        help="draft vocabulary sizes K (default: %(default)s)")
    parser.add_argument("--num-sequences", type=int, default=256,
                        help="answers per temperature, all tasks together (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="per answer (default: %(default)s)")
    parser.add_argument("--data", type=Path, default=None,
                        help="the corpus cache directory (default: $BEBOP_CACHE/corpus, as train-mtp's)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the results here")
    add_device_args(parser, dtype_help="the dtype the policy samples and its logits are made in")


def run(args: argparse.Namespace) -> int:
    from bebop.checks import check_flags
    from bebop.data.tasks import check_task_names

    check_flags(args, ("--num-sequences", "--max-new-tokens", "--threads", "--sizes"), low=1)
    if any(not t > 0 for t in args.temperatures):
        raise ValueError(f"--temperatures must be > 0, got {args.temperatures}")
    check_task_names(args.tasks)
    import torch

    from bebop.commands.device_args import device_and_dtype
    from bebop.data.tasks import get as get_task
    from bebop.heads.config import TrainMTPConfig
    from bebop.heads.corpus import load_corpus
    from bebop.heads.coverage import soft_coverage
    from bebop.models.gguf import cache_root
    from bebop.play import stop_ids
    from bebop.policy import load_policy

    device, dtype = device_and_dtype(args)
    torch.set_num_threads(args.threads)
    # float32 weights name the corpus as train-mtp names it (its cache is shared); the policy samples in `dtype`
    model, tokenizer, _ = load_policy(args.policy, dtype=torch.float32, device=device)
    required = stop_ids(tokenizer, [get_task(name) for name in args.tasks])
    corpora = {}
    for temperature in args.temperatures:
        config = TrainMTPConfig(tasks=tuple(args.tasks), num_sequences=args.num_sequences, temperature=temperature,
                                max_new_tokens=args.max_new_tokens, depth=1)
        corpora[temperature] = load_corpus(args.data or cache_root() / "corpus", model.eval(), tokenizer, config,
                                           dtype=dtype, log=lambda m: print(f"bench coverage: {m}", flush=True))
    sampler = model.to(dtype)
    weight = sampler.lm_head.weight.detach()[: tokenizer.vocab_size]  # [V, d] the ids the tokenizer has
    results = {}
    for temperature, corpus in corpora.items():
        results[temperature] = soft_coverage(sampler, corpus, weight, args.sizes, temperature=temperature,
                                             required=required)
    _print(results, args)
    if args.json is not None:
        args.json.write_text(json.dumps({str(t): [vars(c) for c in cs] for t, cs in results.items()}, indent=2))
    return 0


def _print(results: dict, args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"soft coverage p(S_K), held out ({args.num_sequences} answers: S_K chosen on half, measured on "
                        "the other; ± standard error)")
    table.add_column("K", justify="right")
    for temperature in results:
        table.add_column(f"T = {temperature:g}", justify="right")
    for i, size in enumerate(args.sizes):
        table.add_row(str(size), *(f"{cs[i].mean:.4f} ± {cs[i].sem:.4f} ({cs[i].positions} positions)"
                                   for cs in results.values()))
    Console(width=160).print(table)
