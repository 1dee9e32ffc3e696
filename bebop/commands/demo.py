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
their bound: the tokens per row and engine step over the measured cost of an engine step in plain steps
(`bebop.metrics.theoretical_speedup`'s arithmetic), or the accept length alone where the runs did not log the
engine's step costs. All runs land under
`--out` (default ./runs), so the dashboard shows them:

    bebop dashboard --runs runs
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bebop.commands.device_args import add_device_args
from bebop.commands.gamma_arg import gamma_arg
from bebop.policy import HEAD_HELP, POLICY_HELP
from bebop.rl.config import TASKS, RLConfig

# Per-step counters of the engine's phases in the trainer's train records (seconds summed over the step's engine
# steps): the demo's bound divides by them.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="math", help=f"one of {list(TASKS)}")
    parser.add_argument("--steps", type=int, default=6, help="RL steps per run")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step of the large-batch regime")
    parser.add_argument("--small-prompts", type=int, default=1,
                        help="prompts per step of the small-batch regime (0: skip it)")
    parser.add_argument("--group", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=Path("runs"), help="runs root the dashboard reads")
    parser.add_argument("--policy", default=None, help=f"{POLICY_HELP} (default: the embedded default)")
    parser.add_argument("--head", default="e2e_tv", help=f"the frozen MTP head: {HEAD_HELP} (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gamma", type=gamma_arg, default="auto",
                        help="draft depth of the MTP runs, an int >= 1 or 'auto' (chosen per engine step) "
                             "(default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per phase (default: half the cores)")
    add_device_args(parser, dtype_help="the rollouts' dtype and the update's autocast dtype")


def demo_config(args: argparse.Namespace, prompts: int) -> RLConfig:
    overrides = {"threads": args.threads} if args.threads else {}
    return RLConfig.quick(task=args.task, steps=args.steps, prompts_per_step=prompts, group_size=args.group,
                          max_new_tokens=args.max_new_tokens, seed=args.seed, mtp="frozen", checkpoint_every=0,
                          gamma=args.gamma,
                          samples_per_step=4, device=args.device, gen_dtype=args.dtype, **overrides)


def step_seconds(records: list[dict]) -> dict[str, float] | None:
    """Seconds per engine step (draft; verify with the catch-up after it), pooled over the steps after the first;
    None when the trainer did not log the engine's counters."""
    from bebop.metrics import ENGINE_COUNTERS, engine_step_costs

    timed = records[1:] or records
    if not all(key in timed[0] for key in ENGINE_COUNTERS):
        return None
    costs = engine_step_costs({key: sum(r[key] for r in timed) for key in ENGINE_COUNTERS})
    return None if costs is None else {"draft": costs["draft_s"], "verify": costs["verify_s"]}


def tokens_per_row_step(records: list[dict]) -> float | None:
    """1 + accepted drafts per row and engine step, over every engine step (plain ones too, where gamma="auto" chose
    0): the accept length of a run whose depth varies. None when the engine's row-steps were not logged."""
    row_steps = sum(r.get("engine/num_row_steps", 0) for r in records)
    if not row_steps or "spec/num_accepted_tokens" not in records[0]:
        return None
    return 1 + sum(r["spec/num_accepted_tokens"] for r in records) / row_steps


def regime(plain_records: list[dict], spec_records: list[dict], rows: int) -> dict:
    """One regime's measured speedups and their bound. The bound is the tokens per row and engine step (the accept
    length, plain steps counted) divided by what an engine step costs in plain steps ((verify + drafts) / plain
    step, both measured by the engine in these runs), or the accept length alone (drafting and verifying as cheap
    as one plain step) when the costs were not logged."""
    from bebop.rl.compare import summarize

    plain, spec = summarize(plain_records), summarize(spec_records)
    tokens = tokens_per_row_step(spec_records) or spec["accept_length"]
    out = {"rows": rows, "plain": plain, "spec": spec, "accept_length": spec["accept_length"],
           "end_to_end": plain["step_s"] / spec["step_s"], "rollout": plain["gen_s"] / spec["gen_s"],
           "bound": spec["accept_length"], "verify_cost": None, "gamma_mode": spec.get("gamma_mode"),
           "gamma_mean": spec.get("gamma_mean")}
    plain_cost, spec_cost = step_seconds(plain_records), step_seconds(spec_records)
    if plain_cost and spec_cost and plain_cost["verify"] > 0:
        step_cost = (spec_cost["draft"] + spec_cost["verify"]) / plain_cost["verify"]
        out.update(bound=tokens / step_cost, verify_cost=spec_cost["verify"] / plain_cost["verify"])
    return out


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
        ("rollout time / step (s)", fmt(plain["gen_s"], "{:.2f}"), fmt(spec["gen_s"], "{:.2f}")),
        ("step time (s)", fmt(plain["step_s"], "{:.2f}"), fmt(spec["step_s"], "{:.2f}")),
    ]


def why_they_differ(regimes: list[dict]) -> str:
    """One sentence on why the regimes' speedups differ, with the measured verify costs when there are some."""
    costs = [r for r in regimes if r["verify_cost"] is not None]
    if len(costs) == len(regimes) > 1:
        measured = " and ".join(f"{r['verify_cost']:.1f} plain steps at {r['rows']} rows" for r in regimes)
        return (f"Why they differ: verifying γ+1 tokens per row cost {measured}; the more rows decode together, the "
                "more compute-bound a CPU step is, so the same accept length buys less (a GPU's memory-bound decode "
                "keeps verification near one plain step at RL batch sizes).")
    return ("Why they differ: verifying γ+1 tokens per row costs little more than one plain step when few rows decode "
            "together, but up to γ+1 plain steps when many do (a CPU is compute-bound there), so the same accept "
            "length buys less at large batch (a GPU's memory-bound decode keeps verification cheap).")


def print_summary(regimes: list[dict], dirs: list[Path], head: str, wall_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"GRPO, same seed: plain decoding vs MTP + RS ({head} head, frozen)")
    table.add_column("")
    for r in regimes:
        table.add_column(f"{r['rows']} rows\nno MTP", justify="right")
        table.add_column(f"{r['rows']} rows\nMTP + RS", justify="right")
    columns = [summary_rows(r["plain"], r["spec"]) for r in regimes]
    for lines in zip(*columns):
        table.add_row(lines[0][0], *(cell for line in lines for cell in line[1:]))
    console.print(table)
    speed = Table(title="Speedup of MTP + RS over plain decoding (medians over steps after the first)")
    for name in ("rows per step", "accept length", "rollout", "end to end", "bound"):
        speed.add_column(name, justify="right")
    for r in regimes:
        speed.add_row(str(r["rows"]), f"{r['accept_length']:.2f}", f"{r['rollout']:.2f}x", f"{r['end_to_end']:.2f}x",
                      f"{r['bound']:.2f}x")
    console.print(speed)
    bound = ("tokens per row-step / measured (verify + drafts) step cost in plain steps"
             if all(r["verify_cost"] is not None for r in regimes) else
             "the accept length: the engine's step costs were not logged, so drafting and verifying count as free")
    console.print(f"bound: {bound}. Rewards differ only by sampling noise: RS is lossless.")
    chose = [f"γ={r['gamma_mode']} at {r['rows']} rows (mean {r['gamma_mean']:.1f} over engine steps)"
             for r in regimes if r.get("gamma_mode") is not None]
    if chose:
        console.print("γ=auto chose " + " and ".join(chose) + ": the depth that maximised measured tokens/s "
                      "(acceptance over step cost; γ=0 is plain decoding).")
    console.print(why_they_differ(regimes))
    console.print("What a perfect draft head would reach here: [bold]bebop bench rl --self-draft policy[/bold]")
    console.print("runs: " + ", ".join(str(d) for d in dirs))
    console.print(f"wall time: {wall_s // 60:.0f} min {wall_s % 60:.0f} s (loading the policy included)")
    # The runs' root (what `bebop dashboard` lists), not app/main.py: that path exists only in a clone.
    console.print(f"where to look: [bold]bebop dashboard --runs {dirs[0].parents[1]}[/bold]  (acceptance vs entropy, "
                  "per-position acceptance, step times, samples)")


def run(args: argparse.Namespace) -> int:
    from bebop.commands.device_args import device_and_dtype
    from bebop.policy import head_label, load_policy_heads
    from bebop.rl.compare import run_once

    if args.small_prompts < 0 or args.prompts < 1:
        raise ValueError(f"--prompts must be >= 1 and --small-prompts >= 0, got {args.prompts}, {args.small_prompts}")
    started = time.perf_counter()
    configs = [demo_config(args, p) for p in dict.fromkeys([args.prompts, args.small_prompts]) if p > 0]
    device, dtype = device_and_dtype(args)  # --device cuda without CUDA fails here, before the policy loads
    policy = load_policy_heads(args.policy, [args.head], dtype=dtype, device=device)
    label = head_label(args.head)
    root = args.out / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    regimes, dirs = [], []
    for config in configs:
        records = []
        for rollout, head in (("none", None), ("rs", label)):
            run_dir = root / (f"rows{config.batch_size}-" + ("no-mtp" if rollout == "none" else f"mtp-rs-{label}"))
            records.append(run_once(policy, config.replace(method=rollout), head, run_dir))
            dirs.append(run_dir)
        regimes.append(regime(*records, config.batch_size))
    print_summary(regimes, dirs, label, time.perf_counter() - started)
    return 0
