"""`bebop demo`: the paper's end-to-end claim on your laptop, in a few minutes.

On the embedded default policy (or `--policy`: a checkpoint directory or hub id, with `--head` found by the rules
of `bebop.policy`) it runs the same short GRPO job (async, same seed and prompts) in two regimes, each
twice:

    1. rollouts by plain decoding (no MTP)
    2. rollouts by MTP speculative decoding with rejection sampling, the head (e2e TV by default) kept frozen, at
       `--gamma` (default "auto": the engine chooses each step's draft depth from the acceptance and step costs it
       measures, so at a batch where drafting does not pay it decodes plainly; bebop.engine.depth)

once at `--prompts` x `--group` rows per step (32 by default, a usual RL batch) and once at `--small-prompts` x
`--group` (4: the small effective batch of the long tails of agentic rollouts, where the paper's gain is largest).
It prints what changed: reward and entropy (the same, up to sampling noise: rejection sampling is lossless), the
accept length, the γ the engine chose, the step and rollout times, and per regime the measured speedups beside
what the measured costs predict (`bebop.speedup`: the statistic and the arithmetic the dashboard's Speed page uses,
so both show the same ratios), a measurement beyond its prediction flagged with the numbers that may explain it.
All runs land under `--out` (default ./runs), so the dashboard shows them:

    bebop dashboard --runs runs
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from bebop.commands.device_args import add_device_args
from bebop.commands.gamma_arg import gamma_arg
from bebop.policy import HEAD_HELP, POLICY_HELP
from bebop.rl.config import TASKS, RLConfig

# Per-step counters of the engine's phases in the trainer's train records (seconds summed over the step's engine
# steps): the demo's bound divides by them.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="math", help=f"one of {list(TASKS)} (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=6, help="RL steps per run (default: %(default)s)")
    parser.add_argument("--prompts", type=int, default=8,
                        help="prompts per step of the large-batch regime (default: %(default)s)")
    parser.add_argument("--small-prompts", type=int, default=1,
                        help="prompts per step of the small-batch regime, 0 skips it (default: %(default)s)")
    parser.add_argument("--group", type=int, default=4, help="completions per prompt (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="tokens per completion (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("runs"), help="runs root the dashboard reads")
    parser.add_argument("--policy", default=None, help=f"{POLICY_HELP} (default: the embedded default)")
    parser.add_argument("--head", default="e2e_tv", help=f"the frozen MTP head: {HEAD_HELP} (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the prompts and of sampling, the same in every run (default: %(default)s)")
    parser.add_argument("--gamma", type=gamma_arg, default="auto",
                        help="draft depth of the MTP runs, an int >= 1, 'auto' (chosen per engine step) or 'rows' "
                             "(each row its own per step) "
                             "(default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per phase (default: half the cores)")
    add_device_args(parser, dtype_help="the rollouts' dtype and the update's autocast dtype")


def demo_config(args: argparse.Namespace, prompts: int) -> RLConfig:
    overrides = {"threads": args.threads} if args.threads else {}
    return RLConfig.quick(task=args.task, steps=args.steps, prompts_per_step=prompts, group_size=args.group,
                          max_new_tokens=args.max_new_tokens, seed=args.seed, mtp="frozen", checkpoint_every=0,
                          gamma=args.gamma,
                          samples_per_step=4, device=args.device, dtype=args.dtype, **overrides)


def regime(plain_records: list[dict], spec_records: list[dict], rows: int) -> dict:
    """One regime: both runs summarised and the MTP run's speedup over the plain one beside its prediction from
    measured costs (`bebop.speedup`: the statistic and the arithmetic the dashboard's Speed page uses)."""
    from bebop.rl.compare import summarize
    from bebop.speedup import speedup

    spec = summarize(spec_records)
    return {"rows": rows, "plain": summarize(plain_records), "spec": spec,
            "speed": speedup(plain_records, spec_records), "gamma_mode": spec.get("gamma_mode"),
            "gamma_mean": spec.get("gamma_mean")}


def summary_rows(plain: dict, spec: dict) -> list[tuple[str, str, str]]:
    def fmt(value, pattern="{:.3f}"):
        return "-" if value is None else pattern.format(value)

    return [
        ("reward (mean over steps)", fmt(plain["reward_mean"]), fmt(spec["reward_mean"])),
        ("groups with a reward signal", fmt(plain["groups_with_signal"], "{:.0%}"),
         fmt(spec["groups_with_signal"], "{:.0%}")),
        ("policy entropy (nats)", fmt(plain["entropy"]), fmt(spec["entropy"])),
        ("response length (tokens)", fmt(plain["response_length"], "{:.1f}"), fmt(spec["response_length"], "{:.1f}")),
        ("accept length (steps that drafted)", "-", fmt(spec.get("accept_length"), "{:.2f}")),
        ("γ chosen: most often (mean)", "-", "-" if spec.get("gamma_mode") is None else
         f"{spec['gamma_mode']} ({spec['gamma_mean']:.1f})"),
        *([("γ per row: mean (share plain)", "-", f"{spec['row_depth_mean']:.2f} ({spec['row_plain_share']:.0%})")]
          if "row_depth_mean" in spec else []),
        ("generation: s / step (median)", fmt(plain["gen_s"], "{:.2f}"), fmt(spec["gen_s"], "{:.2f}")),
        ("generation: tokens / s (median)", fmt(plain["tokens_per_s"], "{:.0f}"), fmt(spec["tokens_per_s"], "{:.0f}")),
        ("update: s / step (median)", fmt(plain["update_s"], "{:.2f}"), fmt(spec["update_s"], "{:.2f}")),
        ("whole step: s / step (median)", fmt(plain["step_s"], "{:.2f}"), fmt(spec["step_s"], "{:.2f}")),
    ]


def why_they_differ(regimes: list[dict]) -> str:
    """One sentence on why the regimes' predicted speedups differ, from their numbers: each regime's tokens per
    row-step and step cost, and which of the two differs more (never a factor that is the same in both)."""
    if len(regimes) < 2:
        return ""
    speeds = [r["speed"] for r in regimes]
    if not all(math.isfinite(s.predicted) for s in speeds):
        return "Why they differ: the engine's step costs were not logged, so nothing here says."
    each = "; ".join(f"at {r['rows']} rows an engine step gained {s.tokens_per_row_step:.2f} tokens per row and cost "
                     f"{s.step_cost:.2f} plain steps (predicted {s.predicted:.2f}x)" for r, s in zip(regimes, speeds))
    (large, a), (small, b) = sorted(zip([r["rows"] for r in regimes], speeds), key=lambda x: -x[0])[:2]
    gap, tokens, cost = (math.log(x / y) for x, y in ((a.predicted, b.predicted),
                                                      (a.tokens_per_row_step, b.tokens_per_row_step),
                                                      (a.step_cost, b.step_cost)))
    if abs(gap) < math.log(1.05):
        return f"Why they differ: {each}. The predictions lie within 5% of each other, so the measured difference " \
               "comes from outside the decode loop or from timing noise."
    if abs(tokens) >= abs(cost):
        reason = f"the tokens per row-step ({a.tokens_per_row_step:.2f} at {large} rows, {b.tokens_per_row_step:.2f} " \
                 f"at {small})"
    else:
        reason = f"the step cost ({a.step_cost:.2f} plain steps at {large} rows, {b.step_cost:.2f} at {small})"
    return f"Why they differ: {each}. Most of the gap is {reason}."


def _fmt(value: float, pattern: str = "{:.2f}") -> str:
    return "-" if value is None or math.isnan(value) else pattern.format(value)


def print_summary(regimes: list[dict], dirs: list[Path], head: str, wall_s: float, policy: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from bebop.speedup import STATISTIC

    console = Console()
    table = Table(title=f"GRPO, same seed: plain decoding vs MTP + RS (policy {policy}, {head} head, frozen)")
    table.add_column("")
    for r in regimes:
        table.add_column(f"{r['rows']} rows\nno MTP", justify="right")
        table.add_column(f"{r['rows']} rows\nMTP + RS", justify="right")
    columns = [summary_rows(r["plain"], r["spec"]) for r in regimes]
    for lines in zip(*columns):
        table.add_row(lines[0][0], *(cell for line in lines for cell in line[1:]))
    console.print(table)
    speed = Table(title=f"Speedup of MTP + RS over plain decoding at the same rows per step ({STATISTIC})")
    for name in ("rows per step", "tokens / row-step", "step cost (plain steps)", "predicted", "generation",
                 "end to end"):
        speed.add_column(name, justify="right")
    for r in regimes:
        s = r["speed"]
        speed.add_row(str(r["rows"]), _fmt(s.tokens_per_row_step), _fmt(s.step_cost), _fmt(s.predicted, "{:.2f}x"),
                      _fmt(s.rollout, "{:.2f}x") + (" *" if s.beyond else ""),
                      _fmt(s.end_to_end, "{:.2f}x") + (" †" if s.credit() else ""))
    console.print(speed)
    console.print("predicted: from measured costs, the tokens each row gains per engine step over what an engine step "
                  "of the MTP run costs in the plain run's engine steps (the decode loop only: prefill and the update "
                  "are outside it). Rewards differ only by sampling noise: RS is lossless.")
    for r in regimes:
        if r["speed"].beyond:
            console.print(f"* {r['rows']} rows: {r['speed'].note()}.")
        for note in r["speed"].credit():  # what the speedups owe to something other than drafting
            console.print(f"† {r['rows']} rows: {note}.")
    chose = [f"γ={r['gamma_mode']} at {r['rows']} rows (mean {r['gamma_mean']:.1f} over engine steps)"
             for r in regimes if r.get("gamma_mode") is not None and "row_depth_mean" not in r["spec"]]
    if chose:
        console.print("γ=auto chose " + " and ".join(chose) + ": the depth that maximised measured tokens/s "
                      "(acceptance over step cost; γ=0 is plain decoding).")
    per_row = [f"a mean γ of {r['spec']['row_depth_mean']:.2f} per row-step at {r['rows']} rows "
               f"({r['spec']['row_plain_share']:.0%} at γ=0)" for r in regimes if "row_depth_mean" in r["spec"]]
    if per_row:
        console.print("γ=rows gave each row its own depth, " + " and ".join(per_row) + ": from its predicted "
                      "acceptance, under the verify-token budget the measured step costs set (γ=0 decodes plainly).")
    console.print(why_they_differ(regimes))
    console.print("What a perfect draft head would reach here: [bold]bebop bench rl --self-draft policy[/bold]")
    console.print("runs: " + ", ".join(str(d) for d in dirs))
    console.print(f"wall time: {wall_s // 60:.0f} min {wall_s % 60:.0f} s (loading the policy included)")
    # The runs' root (what `bebop dashboard` lists), not app/main.py: that path exists only in a clone.
    console.print(f"where to look: [bold]bebop dashboard --runs {dirs[0].parents[1]}[/bold]  (acceptance vs entropy, "
                  "per-position acceptance, step times, samples)")


def run(args: argparse.Namespace) -> int:
    if args.small_prompts < 0 or args.prompts < 1:  # before torch loads: a misuse answers at once
        raise ValueError(f"--prompts must be >= 1 and --small-prompts >= 0, got {args.prompts}, {args.small_prompts}")
    from bebop.commands.device_args import device_and_dtype
    from bebop.policy import head_label, load_policy_heads
    from bebop.rl.compare import run_once
    from bebop.runlog.session import default_run_dir

    started = time.perf_counter()
    configs = [demo_config(args, p) for p in dict.fromkeys([args.prompts, args.small_prompts]) if p > 0]
    device, dtype = device_and_dtype(args)  # --device cuda without CUDA fails here, before the policy loads
    policy = load_policy_heads(args.policy, [args.head], dtype=dtype, device=device)
    label = head_label(args.head)
    root = default_run_dir("demo", root=args.out)
    regimes, dirs = [], []
    for config in configs:
        records = []
        for rollout, head in (("none", None), ("rs", label)):
            run_dir = root / (f"rows{config.batch_size}-" + ("no-mtp" if rollout == "none" else f"mtp-rs-{label}"))
            records.append(run_once(policy, config.replace(method=rollout), head, run_dir))
            dirs.append(run_dir)
        regimes.append(regime(*records, config.batch_size))
    print_summary(regimes, dirs, label, time.perf_counter() - started, policy=str(policy.model.name_or_path))
    return 0
