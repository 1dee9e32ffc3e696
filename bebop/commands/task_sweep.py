"""`bebop task-sweep`: a policy's start reward on reasoning-gym tasks across difficulty settings.

    bebop task-sweep --policy smollm2 --dataset chain_sum --grid min_terms+max_terms=2,3 min_digits+max_digits=1,2
    bebop task-sweep --policy smollm2 --tasks "gym:chain_sum?max_terms=2&max_digits=1" "gym:basic_arithmetic"

A grid axis `FIELD[+FIELD...]=V1,V2,...` sets its fields to each value (tied fields share it), and the sweep runs
every combination; `--tasks` names the specs instead (`bebop.data.tasks.gym_spec`). What each row measures, its
intervals and the run directory it writes: `bebop.rl.task_sweep`. Needs reasoning-gym: pip install 'bebop[gym]'.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bebop.commands.device_args import add_device_args
from bebop.commands.prompt_args import add_prompt_args, prompt_fields
from bebop.policy import POLICY_HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default=None, help=f"{POLICY_HELP} (default: the embedded default)")
    parser.add_argument("--tasks", nargs="+", default=None, metavar="SPEC",
                        help="gym specs, gym:NAME?FIELD=VALUE&... (default: SmolLM2's task, two one-digit terms of a "
                             "chain sum, or --dataset's grid)")
    parser.add_argument("--dataset", default=None,
                        help="a reasoning-gym dataset whose --grid to sweep (chain_sum, ...)")
    parser.add_argument("--grid", nargs="*", default=[], metavar="AXIS",
                        help="axes FIELD[+FIELD...]=V1,V2,... of --dataset's config; every combination is a row")
    parser.add_argument("--temperatures", nargs="+", type=float, default=[1.0, 0.0],
                        help="sampling temperatures, 0 = greedy (default: %(default)s)")
    parser.add_argument("--num-problems", type=int, default=64,
                        help="held-out problems per task (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the seed of the problems drawn and of sampling (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--run-dir", type=Path, default=None, help="run directory (default runs/task-sweep-<time>)")
    add_prompt_args(parser)
    add_device_args(parser, dtype_help="the policy's dtype")


def task_specs(args: argparse.Namespace) -> tuple[str, ...] | None:
    """The specs the flags name: --tasks, or --dataset's --grid; None for the config's default."""
    from bebop.rl.task_sweep import grid_specs

    if args.tasks and args.dataset:
        raise ValueError("give --tasks or --dataset (with --grid), not both")
    if args.grid and not args.dataset:
        raise ValueError("--grid sweeps a --dataset's settings: name the dataset (e.g. --dataset chain_sum)")
    if args.dataset:
        return grid_specs(args.dataset, args.grid)
    return tuple(args.tasks) if args.tasks else None


def run(args: argparse.Namespace) -> int:
    from bebop.commands.outputs import check_new_run_dirs
    from bebop.policy import load_policy, run_meta
    from bebop.rl.task_sweep import TaskSweepConfig, sweep, sweep_setup, write_table
    from bebop.runlog.session import default_run_dir, open_session

    specs = task_specs(args)
    config = TaskSweepConfig(**({"tasks": specs} if specs else {}), temperatures=tuple(args.temperatures),
                             num_problems=args.num_problems, max_new_tokens=args.max_new_tokens, seed=args.seed,
                             threads=args.threads, device=args.device, dtype=args.dtype, **prompt_fields(args))
    check_new_run_dirs([args.run_dir], "--run-dir")
    # threads, device (--device cuda without CUDA fails here, before the policy loads) and dtype
    session = open_session(args.run_dir or default_run_dir("task-sweep"), config, kind="task-sweep")
    model, tokenizer, _ = load_policy(args.policy, dtype=session.dtype, device=session.device)
    console = Console(stderr=True)
    with session.begin({**sweep_setup(config), **run_meta(model, [], dtype=session.dtype)}):
        rows = sweep(model, tokenizer, config, session, log=lambda r: console.log(
            f"{r['task']} T={r['temperature']:g}: reward {r['reward']:.3f} ({r['wall_s']:.0f} s)"))
        write_table(session.run_dir, rows)
    print_table(rows)
    print(f"run directory: {session.run_dir}")
    return 0


def print_table(rows: list[dict], console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=200)  # logs and pipes: keep every column readable
    first = {r["task"]: r["temperature"] for r in reversed(rows)}
    table = Table(title="start reward on held-out problems (T = 0: greedy)",
                  caption="reward: mean (partial credit counts) with a 95% Wilson interval over problems, "
                          "conservative for partial credit; Δ: vs the task's first temperature, Newcombe's interval; "
                          "solved, stated, answer line: shares with 95% Wilson intervals; len: mean completion "
                          "tokens; limit: share that hit --max-new-tokens")
    table.add_column("task", overflow="fold")  # a spec is long: wrap it rather than cut its settings
    for col in ("T", "reward % [95% CI]", "Δ pts [95% CI]", "solved % [95% CI] k/n", "stated % [95% CI]",
                "answer line % [95% CI]", "len", "limit %"):
        table.add_column(col, justify="right")
    for r in rows:
        delta = "" if r["temperature"] == first[r["task"]] else _cell(r, "delta", sign=True)
        table.add_row(r["task"], f"{r['temperature']:g}", _cell(r, "reward"), delta,
                      f"{_cell(r, 'solved')} {r['num_solved']}/{r['num_problems']}", _cell(r, "stated"),
                      _cell(r, "answer_line"), f"{r['length']:.1f}", f"{100 * r['at_limit']:.0f}")
    console.print(table)


def _cell(row: dict, key: str, sign: bool = False) -> str:
    """A value and its interval in points: "26.0 [14.6, 38.5]"."""
    fmt = "+.1f" if sign else ".1f"
    return f"{100 * row[key]:{fmt}} [{100 * row[f'{key}_lo']:{fmt}}, {100 * row[f'{key}_hi']:{fmt}}]"
