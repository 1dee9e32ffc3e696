"""`bebop bench depth`: the draft depth chosen live (`--gamma auto`) beside every static depth, on a task's prompts.

The rows of an RL rollout end at different lengths, so its last steps run at few rows, where a draft pays most: the
depth that suits the full batch need not suit its tail, which is what `auto` is for. This benchmark times, for each
task and rows count (`--prompts` x `--group`: GRPO groups whose rows share a prompt), one rollout per depth over the
same prompts with the task's stops and environment: plain decoding (γ = 0, always), each static γ and `auto`. The
engine alone runs (no RL update beside it, as in `bebop bench rl`), in rounds that run every depth once, in turn and
in alternating order, so a slow patch of a shared machine hits every depth of a round alike, after one untimed
round (allocations, kernel caches; `bebop bench rl` skips an RL run's first step alike). Each round draws new
prompts; `auto`'s controller is kept across rounds, as an RL run keeps it: it learns from the warm-up round on.

Reported per (task, rows): each depth's speedup over plain decoding in seconds per generated token, prefill
included (the median over rounds of the ratio within a round), and for `auto` its ratio to the best static depth
(the one `auto` fares worst against, round by round) and the depths it chose.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bebop.commands.bench.rounds import auto_beside_static, round_ratio
from bebop.commands.device_args import add_device_args, device_and_dtype
from bebop.commands.gamma_arg import ADAPTIVE, gamma_arg, static
from bebop.policy import HEAD_HELP, POLICY_HELP, check_policy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default=None, help=f"the policy: {POLICY_HELP}")
    parser.add_argument("--head", default="e2e_tv", help=f"its draft head: {HEAD_HELP} (default: %(default)s)")
    parser.add_argument("--tasks", nargs="+", default=["math", "agent"],
                        help="built-in tasks or dataset specs whose prompts, stops and environment the rows use")
    parser.add_argument("--prompts", nargs="+", type=int, default=[1, 2, 8],
                        help="distinct prompts per rollout, one rows count each (rows = prompts x group)")
    parser.add_argument("--group", type=int, default=4, help="rows per prompt (a GRPO group)")
    parser.add_argument("--gamma", nargs="+", type=gamma_arg, default=["auto", 1, 2, 3],
                        help="depths timed beside plain decoding: ints >= 1, 'auto' (one chosen per step up to the "
                             "largest int given, else 5) and 'rows' (each row its own, likewise)")
    parser.add_argument("--method", choices=("rs", "to"), default="rs", help="verification (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=8, help="rounds, each of every depth once (default: 8)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default: 1, as a rollout "
                        "beside its update gets on 2 cores)")
    parser.add_argument("--seed", type=int, default=0)
    add_device_args(parser)
    parser.add_argument("--json", type=Path, default=None, help="write the records as a JSON list")


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad input in one line before a model is loaded."""
    from bebop.checks import check_flags
    from bebop.data.tasks import check_task_names

    check_flags(args, ("--group", "--max-new-tokens", "--repeats", "--threads", "--prompts"), low=1)
    if any(g < 0 for g in static(args.gamma)) or len(depths(args)) < 2:
        raise ValueError(f"--gamma values must be 'auto', 'rows' or ints >= 0 with at least one to time besides plain "
                         f"decoding (0, always timed), got {args.gamma}")
    check_task_names(args.tasks)
    check_policy(args.policy)
    device_and_dtype(args)


def depths(args: argparse.Namespace) -> list:
    """Plain decoding, the static depths in order, then 'auto' and 'rows' if asked for."""
    return [0, *sorted({g for g in static(args.gamma) if g > 0}), *[g for g in ADAPTIVE if g in args.gamma]]


def time_regime(engines: dict, task, tokenizer, prompts: int, args) -> dict:
    """{"per_token": {depth: seconds per generated token, per timed round}, "chosen": auto's {γ: steps} over them}."""
    from bebop.data.prompts import prompt_format
    from bebop.engine.rollout import GenerationConfig
    from bebop.play import play
    from bebop.rl.batch import sample_examples

    fmt = prompt_format("auto", tokenizer)
    max_gamma = max(static(engines), default=0) or GenerationConfig.max_gamma  # auto's / rows' range
    per_token, chosen = {d: [] for d in engines}, {}
    for r in range(-1, args.repeats):  # round -1 warms up (allocations, kernel caches) and is not timed
        examples = sample_examples(task, prompts, args.group, args.seed + r + 1)
        for depth in list(engines) if r % 2 == 0 else list(engines)[::-1]:
            config = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, gamma=depth,
                                      method=args.method, max_gamma=max_gamma, seed=args.seed + r + 1)
            stats = play(engines[depth], tokenizer, task, examples, config, prompt_format=fmt).rollout.stats
            if r < 0:
                continue
            per_token[depth].append(stats["wall_time_s"] / max(stats["num_generated_tokens"], 1))
            key = {"auto": "spec/num_gamma_chosen/{}", "rows": "spec/num_row_depth/{}"}.get(depth)
            for g in range(max_gamma + 1) if key else ():
                chosen.setdefault(depth, {})
                chosen[depth][g] = chosen[depth].get(g, 0) + stats.get(key.format(g), 0)
    return {"per_token": per_token, "chosen": chosen}


def records(task_name: str, rows: int, timed: dict) -> list[dict]:
    per_token = timed["per_token"]
    plain = per_token[0]
    out = [{"task": task_name, "rows": rows, "gamma": d, "seconds_per_token": statistics.median(s),
            "round_seconds_per_token": s, "speedup": round_ratio(plain, s)} for d, s in per_token.items()]
    fixed = {d: s for d, s in per_token.items() if d not in ADAPTIVE and d > 0}
    for record in out:
        if record["gamma"] in ADAPTIVE:
            record.update(auto_beside_static(per_token[record["gamma"]], fixed, timed["chosen"][record["gamma"]]))
    return out


def print_table(all_records: list[dict]) -> None:
    fixed = sorted({r["gamma"] for r in all_records if r["gamma"] not in ADAPTIVE and r["gamma"] > 0})
    adaptive = [g for g in ADAPTIVE if any(r["gamma"] == g for r in all_records)]
    head = f"{'task':<10}{'rows':>5}" + "".join(f"{'γ=' + str(g):>8}" for g in fixed)
    print(head + "".join(f"{g:>8}{g + '/best':>13}{g + ' γ':>8}" for g in adaptive))
    for task, rows in dict.fromkeys((r["task"], r["rows"]) for r in all_records):
        cells = {r["gamma"]: r for r in all_records if (r["task"], r["rows"]) == (task, rows)}
        line = f"{task:<10}{rows:>5}" + "".join(f"{cells[g]['speedup']:>7.2f}x" for g in fixed)
        for g in adaptive:
            auto = cells[g]
            best = "-" if auto["over_best_static"] is None else (f"{auto['over_best_static']:.2f}"
                                                                 f"±{auto['over_best_static_se']:.2f}")
            line += f"{auto['speedup']:>7.2f}x{best:>13}{auto['gamma_mean']:>8.1f}"
        print(line)
    print("speedup: seconds per generated token of plain decoding over the depth's, medians over rounds of the "
          "ratio within a round; auto/best (rows/best): the same ratio over the static depth it fares worst against, "
          "± its standard error; auto γ: its mean depth per engine step (rows γ: per row-step)")


def run(args: argparse.Namespace) -> int:
    check_args(args)
    import torch

    from bebop.data.tasks import get
    from bebop.engine import Engine
    from bebop.policy import load_policy

    torch.set_num_threads(args.threads)
    device, dtype = device_and_dtype(args)
    tasks = {name: get(name) for name in args.tasks}
    model, tokenizer, head = load_policy(args.policy, args.head, dtype=dtype, device=device)
    out = []
    for name, task in tasks.items():
        for prompts in args.prompts:
            engines = {d: Engine(model, head) for d in depths(args)}  # auto's controller: its own, across rounds
            out += records(name, prompts * args.group, time_regime(engines, task, tokenizer, prompts, args))
    print_table(out)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")
    return 0
