"""`bebop demo`: the paper's end-to-end claim on your laptop, in a few minutes.

On the embedded default policy (or `--policy`: a checkpoint directory or hub id, with `--head` found by the rules
of `bebop.commands.policy`) it runs the same short GRPO job twice (async, same seed and prompts):

    1. rollouts by plain decoding (no MTP)
    2. rollouts by MTP speculative decoding with rejection sampling, the head (e2e TV by default) kept frozen

then prints what changed: reward and entropy (the same, up to sampling noise: rejection sampling is
lossless), the accept length of the speculative run, and the step and rollout times, whose ratio is the
end-to-end speedup. Both runs land under `--out` (default ./runs), so the dashboard shows them:

    bebop dashboard --runs runs
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bebop.commands.policy import HEAD_HELP, POLICY_HELP
from bebop.rl.config import TASKS, RLConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="math", help=f"one of {list(TASKS)}")
    parser.add_argument("--steps", type=int, default=6, help="RL steps per run")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=Path("runs"), help="runs root the dashboard reads")
    parser.add_argument("--policy", default=None, help=f"{POLICY_HELP} (default: the embedded default)")
    parser.add_argument("--head", default="e2e_tv", help=f"the frozen MTP head: {HEAD_HELP} (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)


def demo_config(args: argparse.Namespace) -> RLConfig:
    overrides = {"threads": args.threads} if args.threads else {}
    return RLConfig.quick(task=args.task, steps=args.steps, prompts_per_step=args.prompts, group_size=args.group,
                          max_new_tokens=args.max_new_tokens, seed=args.seed, mtp="frozen", checkpoint_every=0,
                          samples_per_step=4, **overrides)


def summary_rows(plain: dict, spec: dict) -> list[tuple[str, str, str]]:
    def fmt(value, pattern="{:.3f}"):
        return "-" if value is None else pattern.format(value)

    return [
        ("reward (mean over steps)", fmt(plain["reward_mean"]), fmt(spec["reward_mean"])),
        ("policy entropy (nats)", fmt(plain["entropy"]), fmt(spec["entropy"])),
        ("response length (tokens)", fmt(plain["response_length"], "{:.1f}"), fmt(spec["response_length"], "{:.1f}")),
        ("accept length (γ=3)", "-", fmt(spec.get("accept_length"), "{:.2f}")),
        ("rollout time / step (s)", fmt(plain["gen_s"], "{:.2f}"), fmt(spec["gen_s"], "{:.2f}")),
        ("step time (s)", fmt(plain["step_s"], "{:.2f}"), fmt(spec["step_s"], "{:.2f}")),
    ]


def print_summary(plain: dict, spec: dict, dirs: list[Path], rows: int, head: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"GRPO, same seed: plain decoding vs MTP + rejection sampling ({head} head, frozen)")
    table.add_column("")
    table.add_column("no MTP", justify="right")
    table.add_column("MTP + RS", justify="right")
    for row in summary_rows(plain, spec):
        table.add_row(*row)
    console = Console()
    console.print(table)
    console.print(f"end-to-end speedup: [bold]{plain['step_s'] / spec['step_s']:.2f}x[/bold]   "
                  f"rollout speedup: [bold]{plain['gen_s'] / spec['gen_s']:.2f}x[/bold]  "
                  "(medians after the first step; rewards differ only by sampling noise: RS is lossless)")
    console.print(f"{rows} rows decode together per step. Speculative decoding gains most where few do (the long tails "
                  "of agentic rollouts): [bold]bebop demo --prompts 1[/bold] decodes one group; "
                  "[bold]bebop bench rl --self-draft policy[/bold] measures what a perfect draft head would reach here")
    console.print("runs: " + ", ".join(str(d) for d in dirs))
    # The runs' root (what `bebop dashboard` lists), not app/main.py: that path exists only in a clone.
    console.print(f"where to look: [bold]bebop dashboard --runs {dirs[0].parents[1]}[/bold]  (acceptance vs entropy, "
                  "per-position acceptance, step times, samples)")


def run(args: argparse.Namespace) -> int:
    from bebop.commands.bench.rl import run_once, summarize
    from bebop.commands.policy import head_label, load_policy_heads
    from bebop.device import resolve_dtype

    config = demo_config(args)
    policy = load_policy_heads(args.policy, [args.head], dtype=resolve_dtype(None, "cpu"))
    label = head_label(args.head)
    root = args.out / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    summaries, dirs = [], []
    for rollout, head in (("none", None), ("rs", label)):
        run_dir = root / ("no-mtp" if rollout == "none" else f"mtp-rs-{label}")
        records = run_once(policy, config.replace(rollout=rollout), head, run_dir)
        summaries.append(summarize(records))
        dirs.append(run_dir)
    print_summary(*summaries, dirs, config.batch_size, label)
    return 0
