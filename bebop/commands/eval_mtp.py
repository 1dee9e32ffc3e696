"""`bebop eval-mtp`: speculative acceptance of MTP heads by method, temperature and task (PAPER Table 2, §3).

    bebop eval-mtp --heads ce tv e2e_tv --methods to rs --temperatures 0.5 1.0 1.5 2.0 --tasks math

What it measures and the run directory it writes: `bebop.heads.evaluate`.

Every acceptance rate printed carries its counts and a 95% interval, and every difference between heads or
methods says when its own 95% interval holds 0 ("noise"): `bebop.metrics.rate_interval` and
`rate_difference_interval`, binomial over draft tokens, so the real uncertainty is larger, never smaller. The
entropy-law fit needs at least 3 distinct draft entropies (temperatures x tasks); with fewer it says so.

`--policy` is the embedded default, a checkpoint directory or a hub id; each of `--heads` is a head saved beside the
policy (POLICY/heads/NAME: the default ships "ce", "tv", "e2e_tv"), the head stored in the policy's checkpoint
("embedded", or its objective) or a directory written by `save_head`, tried in that order (`bebop.policy`);
`LABEL=HEAD` names it in the tables.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bebop.commands.device_args import add_device_args
from bebop.commands.eval_profiles import add_profile_argument, apply_profile
from bebop.commands.outputs import check_new_run_dirs
from bebop.commands.prompt_args import add_prompt_args, prompt_fields
from bebop.data.tasks import dataset_config
from bebop.data.tasks import get as get_task
from bebop.heads.evaluate import (
    EvalMTPConfig,
    eval_setup,
    fit_slopes,
    short_task,
    sweep,
    table2_cells,
    unfitted,
    write_tables,
)
from bebop.metrics import rate_difference_interval, rate_interval
from bebop.policy import HEAD_HELP, POLICY_HELP, check_head, load_policy_heads, run_meta
from bebop.runlog.session import default_run_dir, open_session


def acceptance_cell(row: dict) -> str:
    """Acceptance % with its 95% interval and counts, e.g. "67.1 [65.0, 69.1] 1342/2000"."""
    k, n = row["num_accepted_tokens"], row["num_draft_tokens"]
    lo, hi = rate_interval(k, n)
    return f"{100 * row['acceptance_rate']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}] {k}/{n}"


def vocab_cell(row: dict) -> str:
    """The head's draft vocabulary: p(S) (the most any draft over S can accept) and its size K; "all" without one."""
    if row.get("draft_vocab") is None:
        return "all"
    share = row["coverage"]
    return f"{'—' if math.isnan(share) else f'{share:.3f}'} / {row['draft_vocab']}"


def delta_cell(row: dict, ref: dict | None) -> str:
    """row's acceptance minus ref's in points, "noise" when the difference's 95% interval holds 0."""
    if ref is None or ref is row:
        return ""
    lo, hi = rate_difference_interval(row["num_accepted_tokens"], row["num_draft_tokens"],
                                      ref["num_accepted_tokens"], ref["num_draft_tokens"])
    return f"{100 * (row['acceptance_rate'] - ref['acceptance_rate']):+.1f}" + (" noise" if lo <= 0 <= hi else "")


def _reference(rows: list[dict], row: dict, vary: str) -> dict:
    """The first row that differs from `row` only in `vary` ("head" or "method"): what its delta is against."""
    same = [k for k in ("task", "temperature", "head", "method") if k != vary]
    return next(r for r in rows if all(r[k] == row[k] for k in same))


def print_tables(rows: list[dict], fits: list[dict], console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=180)  # logs and pipes: keep every column readable
    _print_acceptance(rows, console)
    _print_table2(rows, console)
    _print_fits(rows, fits, console)


def _print_acceptance(rows: list[dict], console: Console) -> None:
    heads, methods = (list(dict.fromkeys(r[k] for r in rows)) for k in ("head", "method"))
    table = Table(title="MTP acceptance (engine counters; d_TV and p(S) teacher-forced)",
                  caption="95% interval: Wilson over draft tokens, which are correlated within a step, so the true "
                          "one is wider; noise: the difference's 95% interval holds 0; p(S) / K: a head's draft "
                          "vocabulary of K ids holds p(S) of the target's probability, its acceptance cap")
    for col in ("task", "T", "head", "method", "accept % [95% CI] accepted/drafted", "accept len", "H(p) draft", "d_TV",
                "p(S) / K"):
        table.add_column(col, justify="right")
    extra = [("head", f"Δ vs {heads[0]}")] * (len(heads) > 1)
    extra += [("method", f"Δ vs {methods[0]}")] * (len(methods) > 1)
    for _, title in extra:
        table.add_column(title, justify="right")
    for r in rows:
        table.add_row(r["task"], f"{r['temperature']:g}", r["head"], r["method"], acceptance_cell(r),
                      f"{r['accept_length']:.2f}", f"{r['draft_entropy_mean']:.3f}", f"{r['d_tv_mean']:.3f}",
                      vocab_cell(r),
                      *(delta_cell(r, _reference(rows, r, vary)) for vary, _ in extra))
    console.print(table)


def _print_table2(rows: list[dict], console: Console) -> None:
    temperature, cells = table2_cells(rows)
    tasks = list(dict.fromkeys(task for _, task in cells))
    heads = list(dict.fromkeys(head for head, _ in cells))
    base = "ce" if "ce" in heads else None
    pivot = Table(title=f"Table 2 layout: RS acceptance % [95% CI] accepted/drafted at T={temperature:g}",
                  caption="then the difference from ce in points (noise: its 95% interval holds 0)" if base else None)
    pivot.add_column("head")
    for task in tasks:
        pivot.add_column(task, justify="right")
    for head in heads:
        row_cells = [cells.get((head, task)) for task in tasks]
        pivot.add_row(head, *("" if r is None else f"{acceptance_cell(r)} {delta_cell(r, cells.get((base, task)))}"
                              for r, task in zip(row_cells, tasks)))
    console.print(pivot)


def _print_fits(rows: list[dict], fits: list[dict], console: Console) -> None:
    reasons: dict[str, list[str]] = {}
    for (task, head, method), why in unfitted(rows, fits).items():  # say why, rather than print an empty table
        reasons.setdefault(why, []).append(f"{short_task(task)} {head} {method}")
    for why, names in reasons.items():
        console.print(f"entropy law: no fit for {', '.join(names)}: {why}", soft_wrap=True)
    if not fits:
        return
    fit_table = Table(title="entropy law over the sweep, one line per task (finding 1): accept length per nat of the "
                            "drafted positions' entropy [95% CI], R² (acceptance rate per nat)")
    for col in ("task", "head", "method", "accept length per nat [95% CI]", "R²", "(acceptance per nat [95% CI], R²)",
                "points"):
        fit_table.add_column(col, justify="right")
    for f in fits:
        fit_table.add_row(short_task(f["task"]), f["head"], f["method"],
                          f"{f['length_slope']:+.3f} {_ci(f['length_slope_ci'])}", f"{f['length_r2']:.2f}",
                          f"({f['slope']:+.3f} {_ci(f['slope_ci'])}, {f['r2']:.2f})", str(f["n"]))
    console.print(fit_table)
    for f in fits:  # what the points cannot support (bebop.entropy_law): said under the table, never dropped
        for flag in f.get("flags", ()):
            console.print(f"{short_task(f['task'])} {f['head']} {f['method']}: {flag}", soft_wrap=True)


def _ci(interval) -> str:
    return f"[{interval[0]:+.3f}, {interval[1]:+.3f}]"


# ----------------------------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = EvalMTPConfig()
    parser.add_argument("--policy", default=None, help=f"{POLICY_HELP} (default: the embedded default)")
    parser.add_argument("--heads", nargs="+", default=list(d.heads),
                        help=f"heads to compare, each {HEAD_HELP}; LABEL=HEAD names it in the tables "
                             "(default: %(default)s)")
    parser.add_argument("--methods", nargs="+", default=list(d.methods),
                        help="verification methods, to and/or rs (default: %(default)s)")
    parser.add_argument("--temperatures", nargs="+", type=float, default=list(d.temperatures),
                        help="sampling temperatures of the sweep; 3 or more fit the entropy law (default: %(default)s)")
    parser.add_argument("--tasks", nargs="+", default=list(d.tasks),
                        help="built-in tasks and/or datasets: jsonl:PATH, parquet:PATH, a save_to_disk directory, "
                             "gym:NAME?FIELD=VALUE&... (reasoning-gym) (default: %(default)s)")
    add_prompt_args(parser)
    parser.add_argument("--gamma", type=int, default=d.gamma, help="draft depth γ (default: %(default)s)")
    parser.add_argument("--num-prompts", type=int, default=d.num_prompts,
                        help="prompts per task and temperature (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens,
                        help="tokens per completion (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=d.seed,
                        help="seed of the prompts and of sampling (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=d.threads, help="torch threads (default: %(default)s)")
    parser.add_argument("--no-dtv", action="store_true",
                        help="skip the teacher-forced d_TV column (it takes about as long as the generation)")
    parser.add_argument("--run-dir", type=Path, default=None, help="run directory (default runs/eval-mtp-<time>)")
    add_device_args(parser, dtype_help="the policy's and heads' dtype")
    add_profile_argument(parser)


def run(args: argparse.Namespace) -> int:
    args = apply_profile(args)
    config = EvalMTPConfig(heads=tuple(args.heads), methods=tuple(args.methods),
                           temperatures=tuple(args.temperatures), tasks=tuple(args.tasks), gamma=args.gamma,
                           num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, seed=args.seed,
                           dtype=args.dtype, threads=args.threads, device=args.device, teacher_forced=not args.no_dtv, **prompt_fields(args))
    check_new_run_dirs([args.run_dir], "--run-dir")
    for head in config.heads:  # names the policy cannot have: refused before it loads
        check_head(args.policy, head)
    # Each dataset read once, before the policy loads.
    tasks = {n: get_task(n, dataset_config(config)) for n in config.tasks}
    # threads, device (--device cuda without CUDA fails here, before the policy loads) and dtype
    session = open_session(args.run_dir or default_run_dir("eval-mtp"), config, kind="eval-mtp")
    policy = load_policy_heads(args.policy, config.heads, dtype=session.dtype, device=session.device)
    model, tokenizer = policy.model, policy.tokenizer
    with session.begin({**eval_setup(config, policy.heads), **run_meta(model, policy.heads.values(),
                                                                        dtype=session.dtype)}):
        rows = sweep(model, tokenizer, policy.heads, config, session, tasks=tasks)
        fits = fit_slopes(rows)
        write_tables(session.run_dir, rows, fits)
    print_tables(rows, fits)
    print(f"run directory: {session.run_dir}")
    return 0

