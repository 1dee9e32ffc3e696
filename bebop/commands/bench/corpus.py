"""`bebop bench corpus`: answers per minute of the head corpus's generation, today's path beside drafting ones.

    bebop bench corpus --policy smollm2 --head e2e_tv --tasks math --gamma 3 auto --rows 64 16 --repeats 3

`train-mtp` generates its corpus through `bebop.heads.corpus.generate_task`: plain sampling, 64 prompts per engine
call (today's path, always timed), or, with `--corpus-head`, drafting with a head and verifying by RS (exact: the
answers keep the policy's distribution). This benchmark runs that same function on the same prompts for plain
sampling at `--plain-rows` and for every (γ, rows) asked, in rounds of one run of each, so a slow patch of a shared
machine hits every cell of a round alike, after an untimed warm-up round. Reported: answers per minute and generated
tokens per second of each cell (the median over rounds), and its speed over plain sampling in seconds per answer
(the median over rounds of the ratio within a round, with its standard error), by the wall clock and by the process's
CPU time. On a machine other jobs share, a cell of minutes sees the load change under it and the wall-clock ratio
swings from round to round; the CPU time this process spent (one thread: what the wall clock would read on an idle
core) moves far less, so its ratio is the one to read there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

from bebop.commands.bench.rounds import round_ratio, round_ratio_se
from bebop.commands.device_args import add_device_args, device_and_dtype
from bebop.commands.gamma_arg import gamma_arg
from bebop.policy import HEAD_HELP, POLICY_HELP, check_policy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default=None, help=f"the policy: {POLICY_HELP}")
    parser.add_argument("--head", default="e2e_tv", help=f"the drafting head: {HEAD_HELP} (default: %(default)s)")
    parser.add_argument("--tasks", nargs="+", default=["math"], help="tasks whose prompts are answered, in turn")
    parser.add_argument("--answers", type=int, default=64, help="answers per cell and round (default: %(default)s)")
    parser.add_argument("--gamma", nargs="+", type=gamma_arg, default=[3, "auto"],
                        help="draft depths timed beside plain sampling: ints >= 1 and 'auto' (default: 3 auto)")
    parser.add_argument("--rows", nargs="+", type=int, default=[64, 16],
                        help="prompts per engine call for the drafting cells (default: 64 16)")
    parser.add_argument("--plain-rows", type=int, default=64, help="prompts per call for plain sampling (today's: 64)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2)
    add_device_args(parser, dtype_help="the dtype the policy samples in (train-mtp's: its --dtype)")
    parser.add_argument("--json", type=Path, default=None, help="write the records as a JSON list")


def check_args(args: argparse.Namespace) -> None:
    from bebop.checks import check_flags
    from bebop.data.tasks import check_task_names

    check_flags(args, ("--answers", "--rows", "--plain-rows", "--max-new-tokens", "--repeats", "--threads"), low=1)
    if any(g != "auto" and g < 1 for g in args.gamma):
        raise ValueError(f"--gamma values must be ints >= 1 or 'auto', got {args.gamma}")
    if not args.temperature > 0:
        raise ValueError(f"--temperature must be > 0, got {args.temperature}")
    check_task_names(args.tasks)
    check_policy(args.policy)
    device_and_dtype(args)


def run(args: argparse.Namespace) -> int:
    check_args(args)
    import time

    import torch

    from bebop.commands.bench.rounds import interleaved
    from bebop.data.tasks import get as get_task
    from bebop.heads.config import TrainMTPConfig
    from bebop.heads.corpus import generate_task
    from bebop.policy import load_policy

    device, dtype = device_and_dtype(args)
    torch.set_num_threads(args.threads)
    model, tokenizer, head = load_policy(args.policy, args.head, dtype=dtype, device=device)
    tasks = {name: get_task(name) for name in args.tasks}
    base = TrainMTPConfig(tasks=tuple(args.tasks), num_sequences=args.answers * len(args.tasks), depth=1,
                          temperature=args.temperature, max_new_tokens=args.max_new_tokens, corpus_rows=args.plain_rows)
    cells = {("plain", 0, args.plain_rows): base}
    for gamma in args.gamma:
        for rows in args.rows:
            cells[("rs", gamma, rows)] = dataclasses.replace(base, corpus_head=args.head, corpus_gamma=gamma,
                                                             corpus_rows=rows)
    made, cpu = {}, {key: [] for key in cells}

    def cell(key, config):
        def go():
            drafter = None if key[0] == "plain" else head
            start = time.process_time()
            parts = [generate_task(model, tokenizer, config, tasks[name], index, drafter=drafter)
                     for index, name in enumerate(args.tasks)]
            cpu[key].append(time.process_time() - start)
            made[key] = sum(len(p["tokens"]) for p in parts), sum(sum(t) for p in parts for t in p["trainable"])
        return go

    start = time.perf_counter()
    # the rounds' keys read as "plain rows=64" and "rs rows=16 γ=3" in the progress line
    named = {key: (key[0], f"rows={key[2]}", key[1], False) for key in cells}
    timed = interleaved({named[key]: cell(key, config) for key, config in cells.items()}, args.repeats, device,
                        label="bench corpus")
    plain = timed[named[("plain", 0, args.plain_rows)]][0]
    records = []
    plain_cpu = cpu[("plain", 0, args.plain_rows)][1:]  # the timed rounds (the first call is the warm-up)
    for key in cells:
        seconds, cpu_s = timed[named[key]][0], cpu[key][1:]
        answers, tokens = made[key]
        records.append({"cell": key[0], "gamma": key[1], "rows": key[2], "answers": answers,
                        "answers_per_min": 60 * answers / statistics.median(seconds),
                        "tokens_per_s": tokens / statistics.median(seconds),
                        "over_plain": round_ratio(plain, seconds), "over_plain_se": round_ratio_se(plain, seconds),
                        "answers_per_cpu_min": 60 * answers / statistics.median(cpu_s),
                        "over_plain_cpu": round_ratio(plain_cpu, cpu_s),
                        "over_plain_cpu_se": round_ratio_se(plain_cpu, cpu_s), "cpu_seconds": cpu_s,
                        "seconds": seconds, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
                        "tasks": args.tasks, "dtype": str(dtype).removeprefix("torch."), "threads": args.threads})
    _print(records, time.perf_counter() - start)
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


def _print(records: list[dict], wall: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"corpus generation, {records[0]['answers']} answers per cell and round "
                        f"({', '.join(records[0]['tasks'])}, T = {records[0]['temperature']}, up to "
                        f"{records[0]['max_new_tokens']} tokens; {wall / 60:.0f} min in all)")
    for column in ("path", "rows", "answers/min", "tokens/s", "speed vs plain (± se)", "answers/CPU-min",
                   "CPU speed vs plain (± se)"):
        table.add_column(column, justify="right")
    for r in records:
        path = "plain (today's)" if r["cell"] == "plain" else f"RS, γ = {r['gamma']}"
        table.add_row(path, str(r["rows"]), f"{r['answers_per_min']:.1f}", f"{r['tokens_per_s']:.0f}",
                      f"{r['over_plain']:.2f}x ± {r['over_plain_se']:.2f}", f"{r['answers_per_cpu_min']:.1f}",
                      f"{r['over_plain_cpu']:.2f}x ± {r['over_plain_cpu_se']:.2f}")
    Console(width=140).print(table)
