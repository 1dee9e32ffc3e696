"""`bebop bench step`: one engine step split into its phases (`bebop.engine.phases`), plain decoding beside each
speculative depth, at each rows count, and where the measured speedup departs from the cost model's.

Each cell (plain decoding, each `--gamma`) is a generation of `--new-tokens` per row over the same prompts (a task's
held-out examples in the policy's chat format, or random tokens), timed with a `PhaseClock`, in interleaved rounds
after an untimed warm-up round, beside the cost model's micro-benchmarks (`bebop bench engine`'s: a one-token
target forward, the verification forward, the head's passes). Printed per rows count:

  * the phases: mean milliseconds per step of each phase, and the step, for every cell;
  * the speedup over plain decoding, measured (wall time, prefill included: the median over rounds of the ratio
    within a round, ± its standard error) beside the cost model's (from the same run's acceptance per position and
    its micro-benchmarks);
  * the gap between them, term by term in log-points (`bebop.engine.phases.gap_terms`): they add up to the gap.

The phases of a compiled engine (`--compile`) are its graphs ("compiled"), the host work between them named as in
an eager one.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bebop.commands.device_args import add_device_args, device_and_dtype
from bebop.commands.gamma_arg import ADAPTIVE, gamma_arg, static
from bebop.policy import HEAD_HELP, POLICY_HELP, check_policy

CALLS = 20  # forwards per micro-benchmark cell (bebop.commands.bench.costs.step_cost_cells)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default=None, help=f"the policy (default: the embedded default): {POLICY_HELP}")
    parser.add_argument("--head", default="e2e_tv", help=f"its draft: {HEAD_HELP} (default: %(default)s)")
    parser.add_argument("--task", default="math", help="prompts: this task's held-out examples (default: %(default)s)")
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 8, 32], help="rows counts (default: 1 8 32)")
    parser.add_argument("--gamma", nargs="+", type=gamma_arg, default=[3],
                        help="speculative depths beside plain decoding: ints >= 1, 'auto' (one depth per step) or "
                             "'rows' (each row its own) (default: 3)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per row (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--compile", action="store_true", help="profile the compiled engine (minutes per shape)")
    parser.add_argument("--cuts", action="store_true",
                        help="also time each cut of the verification on its own, before beside after "
                             "(bebop.commands.bench.cuts)")
    parser.add_argument("--only-cuts", action="store_true", help="time the cuts alone, no engine profile")
    add_device_args(parser)
    parser.add_argument("--json", type=Path, default=None, help="write the records as a JSON list")


def check_args(args: argparse.Namespace) -> None:
    from bebop.checks import check_flags
    from bebop.data.tasks import check_task_names

    check_flags(args, ("--new-tokens", "--repeats", "--batch"), low=1)
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if any(g < 1 for g in static(args.gamma)):
        raise ValueError(f"--gamma values must be ints >= 1, 'auto' or 'rows' (plain decoding is always profiled), "
                         f"got {args.gamma}")
    if not 0 < args.temperature < float("inf"):
        raise ValueError(f"--temperature must be a finite number > 0, got {args.temperature}")
    check_task_names([args.task])
    check_policy(args.policy)
    device_and_dtype(args)


def profile_batch(model, head, tokenizer, batch: int, args) -> dict:
    """{cell: {"seconds": per round, "steps": PhaseClock steps of the timed rounds, "stats": the last rollout's}}
    for plain decoding and each --gamma, and {("cost", part, γ): seconds per round} of the micro-benchmarks."""
    import torch

    from bebop.commands.bench.costs import bench_prompts, step_cost_cells
    from bebop.commands.bench.rounds import interleaved
    from bebop.engine import Engine
    from bebop.engine.phases import PhaseClock
    from bebop.engine.rollout import GenerationConfig

    prompt_args = argparse.Namespace(task=args.task, prompt_len=16)
    prompts, _, _ = bench_prompts(prompt_args, model.config.vocab_size, batch, torch.Generator().manual_seed(0),
                                  tokenizer)
    max_gamma = max(static(args.gamma), default=GenerationConfig.max_gamma)
    calls, cells = {}, {}
    for gamma in [0, *dict.fromkeys(args.gamma)]:
        engine = Engine(model, head, compile=args.compile, phases=PhaseClock())
        config = GenerationConfig(max_new_tokens=args.new_tokens, gamma=gamma, temperature=args.temperature,
                                  seed=1, max_gamma=max_gamma)
        calls[gamma] = []

        def cell(engine=engine, config=config, runs=calls[gamma]):
            engine.phases.clear()
            rollout = engine.generate(prompts, config)
            runs.append((list(engine.phases.steps), rollout.stats))
            return rollout
        cells[("bebop", "plain" if gamma == 0 else "rs", gamma, args.compile)] = cell
        if gamma not in ADAPTIVE and gamma > 0 and engine.mtp is not None:  # (prompt lookup has no head to time)
            context = max(len(p) for p in prompts) + args.new_tokens // 2
            cells.update({("cost", part, gamma, args.compile): fn
                          for part, fn in step_cost_cells(engine, batch, gamma, context, CALLS).items()})
    timed = interleaved(cells, args.repeats, device_and_dtype(args)[0], label=f"batch {batch}")
    out = {"cost": {key[1:3]: seconds for key, (seconds, _) in timed.items() if key[0] == "cost"}}
    for gamma, runs in calls.items():
        key = ("bebop", "plain" if gamma == 0 else "rs", gamma, args.compile)
        out[gamma] = {"seconds": timed[key][0], "steps": [s for steps, _ in runs[1:] for s in steps],
                      "stats": runs[-1][1]}
    return out


def batch_records(batch: int, profiled: dict, args) -> list[dict]:
    """One record per cell: its mean phases, its measured speedup and, for a static depth, the cost model's
    prediction and the gap's terms."""
    from bebop.commands.bench.costs import step_costs
    from bebop.commands.bench.rounds import round_ratio, round_ratio_se
    from bebop.engine.phases import gap_terms, mean_phases, row_step_costs
    from bebop.metrics import expected_tokens_per_step

    plain_seconds = profiled[0]["seconds"]
    plain = mean_phases(profiled[0]["steps"])
    records = [{"batch": batch, "gamma": 0, "phases": plain, "tokens_per_s": batch * args.new_tokens
                / statistics.median(plain_seconds)}]
    for gamma in [g for g in profiled if g not in (0, "cost")]:
        cell, spec = profiled[gamma], mean_phases(profiled[gamma]["steps"])
        record = {"batch": batch, "gamma": gamma, "phases": spec,
                  "tokens_per_s": batch * args.new_tokens / statistics.median(cell["seconds"]),
                  "speedup": round_ratio(plain_seconds, cell["seconds"]),
                  "speedup_se": round_ratio_se(plain_seconds, cell["seconds"])}
        if ("target_1", gamma) in profiled["cost"]:
            parts = {part: profiled["cost"][(part, gamma)] for part in ("catch_up", "single", "target_1",
                                                                        "target_verify")}
            costs = step_costs(parts, gamma)
            alphas = [cell["stats"].get(f"spec/alpha_pos/{i}", 0.0) for i in range(gamma)]
            tokens = expected_tokens_per_step([0.0 if a != a else a for a in alphas], gamma)
            unit = statistics.median(parts["target_1"]) / CALLS
            modelled = unit * (costs["verify_cost"] + gamma * costs["draft_cost"])
            record.update(costs, predicted=tokens * unit / modelled, gap=gap_terms(
                row_step_costs(profiled[0]["steps"]), row_step_costs(cell["steps"]), unit_s=unit, modelled_s=modelled,
                predicted_tokens=tokens, wall_speedup=record["speedup"]))
        records.append(record)
    return records


def print_records(records: list[dict]) -> None:
    from bebop.engine.phases import PHASES

    for batch in dict.fromkeys(r["batch"] for r in records):
        cells = [r for r in records if r["batch"] == batch]
        names = ["plain" if r["gamma"] == 0 else f"γ={r['gamma']}" for r in cells]
        print(f"\nbatch {batch}: milliseconds per step" + "".join(f"{n:>12}" for n in names))
        for phase in [*PHASES, "step"]:
            if any(r["phases"][phase] > 0 for r in cells):
                print(f"  {phase:<38}" + "".join(f"{1e3 * r['phases'][phase]:>12.2f}" for r in cells))
        print(f"  {'tokens per row-step':<38}" + "".join(f"{r['phases']['tokens_per_row']:>12.2f}" for r in cells))
        for r in cells[1:]:
            predicted = f", cost model {r['predicted']:.2f}x" if "predicted" in r else ""
            print(f"  γ={r['gamma']}: {r['speedup']:.2f}x ± {r['speedup_se']:.2f} plain measured{predicted}")
            for term, points in r.get("gap", {}).items():
                print(f"      {term:<40}{points:>+8.1f}")
            if "gap" in r:
                print(f"      {'total (100 ln measured / predicted)':<40}{sum(r['gap'].values()):>+8.1f}")


def time_cuts_of(model, head, batch: int, args) -> dict:
    """Each cut of the verification on its own at `batch` rows (bebop.commands.bench.cuts): the math on SmolLM2's
    shapes (q over the head's draft vocabulary, when it has one), the ragged forward on the model itself."""
    import torch

    from bebop.commands.bench.cuts import GAMMA, compaction_cells, cut_cells, forward_cells, time_cuts

    vocab = model.config.vocab_size
    ids = getattr(head, "draft_ids", None)
    cells = cut_cells(batch, vocab, ids if ids is not None else torch.arange(vocab), args.temperature)
    if ids is None:  # q already over V: nothing to spread
        cells = {key: fn for key, fn in cells.items() if key[0] != "q over V"}
    if batch > 1:
        context = 64 + args.new_tokens // 2  # a rollout's cache, half written
        cells.update(forward_cells(model, batch, context=context))
        cells.update(compaction_cells(model, batch, context=context, max_len=64 + args.new_tokens + GAMMA + 1))
    return time_cuts(cells, max(args.repeats, 3))


def run(args: argparse.Namespace) -> int:
    check_args(args)
    import torch

    from bebop.commands.bench.cuts import print_cuts
    from bebop.policy import load_policy

    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = device_and_dtype(args)
    model, tokenizer, head = load_policy(args.policy, args.head, dtype=dtype, device=device)
    records, cuts = [], {}
    for batch in args.batch:
        if not args.only_cuts:
            records += batch_records(batch, profile_batch(model, head, tokenizer, batch, args), args)
        if args.cuts or args.only_cuts:
            cuts[batch] = time_cuts_of(model, head, batch, args)
    print_records(records)
    for batch, timed in cuts.items():
        print_cuts(batch, timed)
        records.append({"batch": batch, "cuts": timed})
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=1))
        print(f"wrote {args.json}")
    return 0
